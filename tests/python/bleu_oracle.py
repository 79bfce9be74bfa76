"""Writes tests/data/bleu_cases.json: sacrebleu's own 13a tokenisation and corpus BLEU for fixed cases,
the oracle of spanformer's BLEU (tests/test_bleu.cpp). Run where sacrebleu is installed (the GPU machine
has 2.6.0; PyPI is not reachable here):  python3 tests/python/bleu_oracle.py OUT.json
"""
import json
import sys

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

lines = ["Hello, world!", "It's 3.14 or 1,000.5 -- not 9-11.", "state-of-the-art (really) [yes] {no} $5 & 50%",
         "He said &quot;no&quot; &amp; left &lt;fast&gt;.", "U.S.A. e.g. a.b,c", "Café. Noël, déjà-vu!",
         "  many   spaces\there  ", "", "<skipped> x", "end-\nof line", "a/b:c;d?e@f=g^h_i`j|k~l",
         "'quoted' \"double\"", "2.", ".5", "x.", "1.5.", "-3 - 4", "tab\tand\nnewline"]
tok = Tokenizer13a()
cases = []
def add(name, hyps, refs):  # refs: list of reference streams, each as long as hyps
    b = sacrebleu.corpus_bleu(hyps, refs)
    cases.append({"name": name, "hyps": hyps, "refs": refs, "score": b.score, "counts": b.counts,
                  "totals": b.totals, "bp": b.bp, "sys_len": b.sys_len, "ref_len": b.ref_len})
add("readme", ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."],
    [["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
     ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."]])
add("readme one stream", ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."],
    [["The dog bit the man.", "It was not unexpected.", "The man bit him first."]])
add("identical", ["I am hungry.", "We will go to Paris tomorrow."], [["I am hungry.", "We will go to Paris tomorrow."]])
add("no 4-gram match", ["the cat sat on a mat", "a quick brown dog"], [["the cat sat on the mat", "the quick brown fox"]])
add("short hypothesis", ["the cat"], [["the cat sat on the mat today"]])
add("long hypothesis", ["he is a very very very good and kind man"], [["he is a good man"]])
add("no match", ["xyz"], [["abc def"]])
add("empty hypothesis", ["", "I see."], [["Nothing here.", "I see."]])
add("french-english", ["Tom is not here.", "I don't know why he left.", "Where is the station?", "She likes cats a lot."],
    [["Tom isn't here.", "I don't know why he left.", "Where's the station?", "She really likes cats."]])
json.dump({"sacrebleu": sacrebleu.__version__, "tokenize_13a": [[l, tok(l)] for l in lines], "corpus_bleu": cases},
          open(sys.argv[1], "w"), indent=1, ensure_ascii=False)
print(open(sys.argv[1]).read()[:3000])
