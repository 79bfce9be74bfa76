"""spanformer.load() from Python against the command line, on small models of three families trained
here by the CLI (an adaptive-span byte LM on Dickens, an encoder-decoder Transformer on a synthetic
word-for-word language, a ViT on Fashion-MNIST when Debian's data set is installed):

    /usr/bin/python3 tests/python/test_load.py BUILD/spanformer SOURCE_DIR

1. evaluate() returns the record `spanformer eval --json` prints: the same figure (bpc, BLEU, accuracy)
   and counts. Both run one thread, the same code (train/eval_checkpoint.h) on the same weights, so the
   figures must agree to rounding of the JSON text (1e-12);
2. generate() continues a prompt exactly as `spanformer generate --seed` does (same seed, same bytes);
   translate() as `spanformer translate`;
3. spans() equals `spanformer spans --json`; report() writes `spanformer report`'s page; state_dict() holds every parameter of the exported
   safetensors file, bit for bit;
4. attention() returns the weights behind `spanformer attention`: per layer (1, K, n, S + 1) for the
   language model, (L, K, T, S) per sentence for the Transformer, (b, K, N, N) per layer for the ViT,
   every row a distribution (sums to 1 within 1e-6: adaptive span renormalises its masked weights by
   sum + 1e-8, as the reference does, so a row may fall short of 1 by 1e-8 / sum);
5. a missing checkpoint raises RuntimeError naming the path.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
import torch  # noqa: E402

import safetensors_io  # noqa: E402
import spanformer  # noqa: E402

BIN, SRC = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
tmp = tempfile.mkdtemp()


def cli(*args):
    return subprocess.run([BIN, "--threads", "1", *args], check=True, capture_output=True, text=True).stdout


def close(a, b, tol=1e-12):
    assert abs(a - b) <= tol * max(1.0, abs(b)), (a, b)


def rows_are_distributions(w):
    sums = w.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6, rtol=0), sums


def same_weights(model, run):
    path = os.path.join(tmp, os.path.basename(run) + ".safetensors")
    cli("export", "safetensors", run, "-o", path)
    exported = safetensors_io.read(path)[0]
    mine = model.state_dict()
    for name, t in exported.items():
        assert name in mine, name
        assert torch.equal(mine[name].to(t.dtype), t), name


# ---- adaptive span, bytes ------------------------------------------------------------------------
text = open(os.path.join(SRC, "..", "shared", "data", "dickens.txt"), "rb").read()[:200000]
open(os.path.join(tmp, "d.txt"), "wb").write(text)
cli("data", "prepare", os.path.join(tmp, "d.txt"), "--out", os.path.join(tmp, "data"))
json.dump({"model": {"nb_layers": 2, "hidden_size": 32, "inner_hidden_size": 64, "nb_heads": 2, "attn_span": 64,
                     "block_size": 32, "adapt_span_init": 0.2},
           "train": {"batch_size": 4, "nb_steps": 20, "eval_interval": 20, "eval_blocks": 4, "lr_warmup": 5}},
          open(os.path.join(tmp, "c.json"), "w"))
run = os.path.join(tmp, "lm")
cli("train", "-c", os.path.join(tmp, "c.json"), "--data", os.path.join(tmp, "data"), "--out", run, "--quiet")
m = spanformer.load(run)
assert m.family == "adaptive-span" and m.step == 20 and len(m.vocab) > 30, m
mine = m.evaluate("test", batch=4)
theirs = json.loads(cli("eval", run, "--split", "test", "--batch", "4", "--json"))
close(mine["bpc"], theirs["bpc"])
assert mine["tokens"] == theirs["tokens"] and mine["blocks"] == theirs["blocks"], (mine, theirs)
prompt = "It was the best of times"
assert cli("generate", run, "--prompt", prompt, "--tokens", "40", "--seed", "3") == prompt + m.generate(prompt, 40, seed=3) + "\n"
spans = json.loads(cli("spans", run, "--json", "--out", os.path.join(tmp, "s.png")))["spans"]
# report(): the page the CLI writes, but for the time it was written.
page = spanformer.report(run, os.path.join(tmp, "py.html"))
cli("report", run, "--out", os.path.join(tmp, "cli.html"))
strip = lambda p: re.sub(r'"written":"[^"]*"', "", open(p).read())
assert strip(page) == strip(os.path.join(tmp, "cli.html")) and "uPlot" in strip(page)
assert torch.allclose(m.spans(), torch.tensor(spans, dtype=torch.float64), atol=1e-12, rtol=0)
weights = m.attention(text=prompt + ", it was the worst of times")
assert len(weights) == 2, len(weights)
for w in weights:
    assert w.dtype == torch.float64 and w.dim() == 4 and w.shape[:2] == (1, 2), w.shape
    rows_are_distributions(w)
same_weights(m, run)
try:
    spanformer.load(os.path.join(tmp, "missing"))
    raise AssertionError("loading a missing checkpoint succeeded")
except RuntimeError as e:
    assert "missing" in str(e).splitlines()[0], str(e)

# ---- seq2seq, the encoder-decoder Transformer ----------------------------------------------------
random.seed(4)
en = "i you we see like the a cat dog house red big small".split()
fr = "je tu nous vois aime le un chat chien maison rouge grand petit".split()
with open(os.path.join(tmp, "pairs.txt"), "w") as f:
    for _ in range(1500):
        idx = [random.randrange(len(en)) for _ in range(random.randint(1, 6))]
        f.write(" ".join(en[i] for i in idx).capitalize() + ".\t" + " ".join(fr[i] for i in idx).capitalize() + " .\n")
run = os.path.join(tmp, "tf")
cli("train", "-c", os.path.join(SRC, "configs", "seq2seq", "transformer.json"), "--out", run, "--data",
    os.path.join(tmp, "pairs.txt"), "--d_model=32", "--n_layer=1", "--n_head=2", "--d_inner=64", "--dropout=0",
    "--max_length=8", "--valid_pairs=100", "--test_pairs=100", "--batch_size=32", "--nb_steps=60",
    "--eval_interval=60", "--lr_warmup=10", "--lr=3e-3", "--eval_batch_size=100", "--quiet")
m = spanformer.load(run)
assert m.family == "seq2seq", m
mine, theirs = m.evaluate(), json.loads(cli("eval", run, "--json"))
close(mine["bleu"], theirs["bleu"])
close(mine["accuracy"], theirs["accuracy"])
sentences = ["Je vois le chat .", "Nous aimons un grand chien ."]
assert m.translate(sentences, beam=2) == cli("translate", run, "--beam", "2", "--text", sentences[0], "--text",
                                             sentences[1]).splitlines()
weights = m.attention(texts=sentences)
assert len(weights) == 2
for w in weights:
    assert w.dim() == 4 and w.shape[:2] == (1, 2), w.shape  # (L, K, T, S)
    rows_are_distributions(w)
same_weights(m, run)

# ---- ViT on Fashion-MNIST ------------------------------------------------------------------------
fashion = "/usr/share/datasets/fashion-mnist"
if os.path.isdir(fashion):
    run = os.path.join(tmp, "vit")
    cli("train", "-c", os.path.join(SRC, "configs", "vit", "fashion_mnist.json"), "--out", run, "--d_model=16",
        "--d_inner=32", "--n_layer=2", "--n_head=2", "--batch_size=32", "--nb_steps=10", "--eval_interval=10",
        "--lr_warmup=2", "--valid_images=500", "--quiet")
    m = spanformer.load(run)
    mine, theirs = m.evaluate("valid"), json.loads(cli("eval", run, "--split", "valid", "--json"))
    close(mine["accuracy"], theirs["accuracy"])
    close(mine["nll"], theirs["nll"])
    weights = m.attention(indices=[0, 3])
    assert len(weights) == 2 and weights[0].shape == (2, 2, 50, 50), [w.shape for w in weights]
    for w in weights:
        rows_are_distributions(w)
else:
    print("vit part skipped: dataset-fashion-mnist not installed")
print("spanformer.load: every check passed")
