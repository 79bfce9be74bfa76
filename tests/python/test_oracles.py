"""spanformer held to the libraries users would check it with, in the same process:

1. sacrebleu 2.6.0: the 13a tokenisation of 2000 random lines, and corpus BLEU (score to 1e-9, n-gram
   counts, totals and lengths exactly) of 300 random corpora: one to three reference streams, empty
   lines, unicode letters and spaces, HTML entities, numbers with separators, sentences of 300 words.
   Then the fra-eng test translations of a Transformer trained here: `spanformer eval --dump-outputs`
   writes the references and translations it scored, and sacrebleu's BLEU of them equals the BLEU the
   eval printed (to its JSON's rounding, 1e-9).
2. safetensors 0.8.0: a file `spanformer export safetensors` wrote, read by the library, holds the
   model's state_dict bit for bit; files the library writes (F32, F64, F16, BF16 values, tensors in its
   own order) import into every family with `spanformer import safetensors` and evaluate as the model
   with those weights (the same record as the original checkpoint for F32/F64; F16/BF16 weights are
   rounded, so the figure is compared with the rounded model's).
"""
import json
import os
import random
import subprocess

import pytest
import sacrebleu
import safetensors.torch
import torch
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

import spanformer
from hf_models import KINDS, hf_model, hf_pair, prompt_ids

torch.set_num_threads(1)

# ---- 1. BLEU ----------------------------------------------------------------------------------------

WORDS = ("the a cat dog house runs ran is isn't won't don't I'm you're state-of-the-art e.g. U.S.A. 3.14 1,000.5 "
         "9-11 5 -3 2. .5 x. 1.5. $5 50% & (really) [yes] {no} a/b:c;d?e@f=g^h_i`j|k~l 'quoted' \"double\" "
         "café Noël déjà-vu naïve Ärger straße 東京 日本語 привет мир ελληνικά العربية 😀 🚀 ☃ "
         "&quot;no&quot; &amp; &lt;fast&gt; <skipped> end- -- ... !? ; : , . - _").split()
SPACES = [" ", " ", " ", "  ", "\t", "\u00a0", "\u2009", "\u3000", "\u202f", "\u2028", "\x1f", "\x0b"]


def random_line(rng, long=False):
    n = rng.choice([0, 1, 2, 5, 8, 12, 20]) if not long else 300
    line = ""
    for i in range(n):
        line += rng.choice(WORDS) + (rng.choice(SPACES) if i + 1 < n else "")
    if rng.random() < 0.1:
        line = rng.choice(SPACES) + line + rng.choice(SPACES)  # leading and trailing whitespace
    if rng.random() < 0.05:
        line = line.replace(" ", "-\n", 1)  # 13a joins "-\n"
    return line


def mutate(rng, line):
    """A hypothesis sharing some n-grams with a reference: words dropped, replaced, swapped, added."""
    words = line.split()
    out = []
    for w in words:
        r = rng.random()
        if r < 0.15:
            continue
        out.append(rng.choice(WORDS) if r < 0.3 else w)
        if rng.random() < 0.05:
            out.append(rng.choice(WORDS))
    if len(out) > 1 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return " ".join(out)


def test_tokenize_13a_is_sacrebleus():
    rng = random.Random(1)
    tok = Tokenizer13a()
    for i in range(2000):
        line = random_line(rng, long=i % 200 == 0)
        assert spanformer.tokenize_13a(line) == tok(line), repr(line)


def same_bleu(mine, theirs, what):
    assert abs(mine["score"] - theirs.score) <= 1e-9 * max(1.0, theirs.score), (what, mine, theirs)
    assert abs(mine["bp"] - theirs.bp) <= 1e-12, (what, mine, theirs)
    assert (mine["counts"], mine["totals"]) == (list(theirs.counts), list(theirs.totals)), (what, mine, theirs)
    assert (mine["sys_len"], mine["ref_len"]) == (theirs.sys_len, theirs.ref_len), (what, mine, theirs)


def test_corpus_bleu_is_sacrebleus_on_random_corpora():
    rng = random.Random(2)
    nonzero = 0
    for case in range(300):
        lines = rng.randint(1, 30)
        streams = rng.randint(1, 3)
        refs = [[random_line(rng, long=rng.random() < 0.02) for _ in range(lines)] for _ in range(streams)]
        hyps = [mutate(rng, refs[0][i]) if rng.random() < 0.9 else random_line(rng) for i in range(lines)]
        theirs = sacrebleu.corpus_bleu(hyps, refs)
        same_bleu(spanformer.bleu(hyps, refs), theirs, f"corpus {case}")
        nonzero += theirs.score > 0
    assert nonzero > 200, nonzero  # most corpora share 4-grams with their hypotheses: the scores are not all 0


def test_trained_translations_score_as_sacrebleu_scores_them(cli, shared, tmp_path):
    run, dump = str(tmp_path / "fr"), str(tmp_path / "outputs.tsv")
    source = os.path.join(os.path.dirname(__file__), "..", "..")
    cli("train", "-c", os.path.join(source, "configs", "seq2seq", "transformer.json"), "--out", run, "--data",
        os.path.join(shared, "data", "fra-eng", "fra.txt"), "--d_model=64", "--n_layer=1", "--n_head=2",
        "--d_inner=128", "--max_length=8", "--valid_pairs=200", "--test_pairs=300", "--nb_steps=800",
        "--batch_size=64", "--eval_interval=800", "--lr_warmup=100", "--lr=3e-3", "--eval_batch_size=100", "--quiet")
    record = json.loads(cli("eval", run, "--json", "--dump-outputs", dump))
    rows = [line.rstrip("\n").split("\t") for line in open(dump, encoding="utf-8")]
    assert len(rows) == 300 and all(len(r) == 2 for r in rows), rows[:3]
    refs, hyps = [r for r, _ in rows], [h for _, h in rows]
    theirs = sacrebleu.corpus_bleu(hyps, [refs])
    assert theirs.score > 3 and theirs.counts[3] > 0, theirs  # a model that translates: 4-grams match
    assert abs(record["bleu"] - theirs.score) <= 1e-9 * theirs.score, (record, theirs)
    same_bleu(spanformer.bleu(hyps, [refs]), theirs, "fra-eng test")


# ---- 2. safetensors -----------------------------------------------------------------------------------

FAMILIES = ["adaptive_span_run", "xl_run", "par_run", "gpt_run", "seq2seq_run", "vit_run"]


def evaluate(cli, path):
    record = json.loads(cli("eval", path, "--json"))
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("seconds", "step")}


@pytest.mark.parametrize("family", FAMILIES)
def test_safetensors_reads_our_files_and_we_read_its(family, request, cli, tmp_path):
    run = request.getfixturevalue(family)
    exported = str(tmp_path / "ours.safetensors")
    cli("export", "safetensors", run, "-o", exported)
    theirs = safetensors.torch.load_file(exported)
    mine = spanformer.load(run).state_dict()
    assert theirs and set(theirs) <= set(mine), sorted(set(theirs) ^ set(mine))[:5]
    for name, t in theirs.items():
        assert t.dtype == mine[name].dtype and torch.equal(t, mine[name]), name
    with safetensors.safe_open(exported, "pt") as f:
        metadata = f.metadata()
    assert "spanformer.sha256" in metadata and "spanformer.header_sha256" in metadata, sorted(metadata)
    # the library's file, in its own tensor order and dtypes, carries no spanformer checksum: a note, then read
    del metadata["spanformer.sha256"], metadata["spanformer.header_sha256"]

    baseline = evaluate(cli, run)
    rng = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        # the library's own file: its tensor order, the values in this dtype
        tensors = {name: t.to(dtype) for name, t in sorted(theirs.items(), key=lambda kv: torch.rand(1, generator=rng).item())}
        written = str(tmp_path / f"lib_{str(dtype)[6:]}.safetensors")
        safetensors.torch.save_file(tensors, written, metadata=metadata)
        checkpoint = str(tmp_path / f"imported_{str(dtype)[6:]}.pt")
        cli("import", "safetensors", written, "-o", checkpoint)
        loaded = spanformer.load(checkpoint).state_dict()
        for name, t in tensors.items():
            assert torch.equal(loaded[name], t.to(loaded[name].dtype)), (dtype, name)
        got = evaluate(cli, checkpoint)
        if dtype in (torch.float32, torch.float64):  # the same weights: the same record, to the JSON's digits
            assert got == baseline, (dtype, got, baseline)
        else:  # rounded weights: another model, still a finite figure of the same kind
            assert got.keys() == baseline.keys() and all(v == v and abs(v) < 1e30 for v in got.values()), got


# ---- 3. attention against PyTorch's own -------------------------------------------------------------

def causal_band_mask(N, C, band):
    """True where query i (key position C - N + i) reads key j: p_i - band < j <= p_i (band 0: all j <= p_i)."""
    p = torch.arange(C - N, C).unsqueeze(1)  # (N, 1)
    j = torch.arange(C).unsqueeze(0)        # (1, C)
    return (j <= p) & ((j > p - band) if band > 0 else True)


def leaves(*shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def value_and_grads(f, inputs, grad_out):
    out = f(*inputs)
    grads = torch.autograd.grad(out, inputs, grad_out)
    return out.detach(), grads


@pytest.mark.parametrize("band", [0, 1, 7, 56])
def test_flash_and_window_attention_are_sdpas(band):
    """Dense causal (band 0) and sliding-window attention, with a KV cache (C > N): the op and its plain
    composition against SDPA with the same boolean mask, float64, values and gradients to 1e-12."""
    B, K, N, C, D = 2, 3, 40, 56, 16
    q, k, v = leaves((B, K, N, D), (B, K, C, D), (B, K, C, D), seed=band)
    grad_out = torch.randn(B, K, N, D, dtype=torch.float64)
    mask = causal_band_mask(N, C, band)
    want, want_grads = value_and_grads(
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), grad_out)
    for op in (spanformer.flash_attention, torch.ops.spanformer.flash_attention_reference):
        got, got_grads = value_and_grads(lambda q, k, v: op(q, k, v, band), (q, k, v), grad_out)
        assert torch.allclose(got, want, atol=1e-12, rtol=0), (op, (got - want).abs().max())
        for name, a, b in zip("qkv", got_grads, want_grads):
            assert torch.allclose(a, b, atol=1e-11, rtol=0), (op, name, (a - b).abs().max())


@pytest.mark.parametrize("dtype,products", [(torch.float32, "auto"), (torch.bfloat16, "widened"),
                                            (torch.bfloat16, "native")], ids=["float32", "bfloat16-widened", "bfloat16-native"])
@pytest.mark.parametrize("band", [0, 33])
def test_flash_attention_in_32_and_16_bits_is_as_close_to_sdpa_as_sdpa_itself(dtype, products, band):
    """The op in float32 and bfloat16 (the fused CPU kernel, bfloat16 with either kind of products:
    widened to float32 and rounded once, or bf16 operands with float32 sums, spanformer.cpu_half_products)
    against SDPA in float64 with the same mask, over tiles that split (T 300): each output and gradient
    within twice SDPA's own error in that dtype (relative to the largest float64 magnitude), SDPA's
    error floored where it happens to be near exact as tests/op_cases.h floors the composition's (fp32
    1e-6, bf16 1e-2)."""
    got = spanformer.cpu_half_products(products)
    assert products == "auto" or got == products, (products, got)
    try:
        flash_against_sdpa(dtype, band)
    finally:
        spanformer.cpu_half_products("auto")


def flash_against_sdpa(dtype, band):
    B, K, N, D = 2, 3, 300, 64
    q, k, v = leaves((B, K, N, D), (B, K, N, D), (B, K, N, D), seed=20 + band)
    grad_out = torch.randn(B, K, N, D, dtype=torch.float64)
    mask = causal_band_mask(N, N, band)
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    truth = value_and_grads(sdpa, (q, k, v), grad_out)
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    peer = value_and_grads(sdpa, low, grad_out.to(dtype))
    ours = value_and_grads(lambda q, k, v: spanformer.flash_attention(q, k, v, band), low, grad_out.to(dtype))
    floor = 1e-6 if dtype == torch.float32 else 1e-2
    for name, want, theirs, got in zip(["out", "q", "k", "v"], [truth[0], *truth[1]], [peer[0], *peer[1]],
                                       [ours[0], *ours[1]]):
        scale = want.abs().max().item()
        peer_error = (theirs.double() - want).abs().max().item() / scale
        our_error = (got.double() - want).abs().max().item() / scale
        print(f"{dtype} band {band} {name}: ours {our_error:.3g}, SDPA {peer_error:.3g}")
        assert our_error <= 2 * max(peer_error, floor), (name, our_error, peer_error)


def span_problem(seed, ratios):
    B, K, M, L, D, R = 2, len(ratios), 24, 40, 8, 8.0
    q, k, v, key_pe = leaves((B, K, M, D), (B, K, L + M, D), (B, K, L + M, D), (D, L), seed=seed)
    span_ratio = torch.tensor(ratios, dtype=torch.float64)
    return q, k, v, key_pe, span_ratio, L, R


def span_terms(q, key_pe, span_ratio, L, R):
    """The position term, log(mask) and the window (0 inside, -inf outside) of every (query, key row) as
    (B, K, M, L + M) tensors, and z: key row j of query i is distance d = i + L - j (1 .. L inside the
    window), m_d = clamp((R + z - (d - 1)) / R, 0, 1)."""
    B, K, M, D = q.shape
    i = torch.arange(M).unsqueeze(1)
    j = torch.arange(L + M).unsqueeze(0)
    d = i + L - j                                        # (M, L + M)
    inside = (d >= 1) & (d <= L)
    col = (L - d).clamp(0, L - 1)                        # key_pe column of distance d
    pos = (q @ key_pe) / D ** 0.5                        # (B, K, M, L)
    pos = torch.gather(pos, 3, col.expand(B, K, M, L + M))
    z = (span_ratio * L).view(1, K, 1, 1)
    m = ((R + z - (d - 1)) / R).clamp(0, 1)              # (1, K, M, L + M)
    minus_inf = torch.tensor(float("-inf"), dtype=q.dtype)
    return pos, torch.where(inside, m.log(), minus_inf), torch.where(inside, 0.0, minus_inf), z


def z_term(scores, log_m):
    """S / (S + 1e-8 Z) per query, (B, K, M, 1): S = sum_d e_d m_d, Z = sum_d e_d over the window, from
    the two log-sum-exps (scores: -inf outside the window)."""
    return 1 / (1 + 1e-8 * torch.exp(scores.logsumexp(-1, keepdim=True) - (scores + log_m).logsumexp(-1, keepdim=True)))


@pytest.mark.parametrize("ratios", [[0.1, 0.5, 1.0, 0.02], [1.0, 1.0, 1.0, 1.0]], ids=["bimodal", "all-at-L"])
def test_adaptive_span_attention_is_sdpas_and_flexattentions(ratios):
    """The reference's a_d = e_d m_d / (S + 1e-8 Z) is softmax(score + log m) times S / (S + 1e-8 Z)
    (include/spanformer/ops/adaptive_span_attention.h): the op and its plain composition against SDPA
    with that float mask, times the factor (values and gradients of q, k, v and key_pe, float64, 1e-12
    and 1e-11), and against FlexAttention with score + position + log m as score_mod and each head's
    span as its block mask, the factor from FlexAttention's own log-sum-exps (values: FlexAttention has
    no backward on the CPU)."""
    q, k, v, key_pe, span_ratio, L, R = span_problem(11, ratios)
    grad_out = torch.randn(q.shape, dtype=torch.float64)

    def sdpa(q, k, v, key_pe):
        pos, log_m, window, _ = span_terms(q, key_pe, span_ratio, L, R)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + pos + window  # (B, K, M, L + M)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=pos + log_m)
        return out * z_term(scores, log_m)

    want, want_grads = value_and_grads(sdpa, (q, k, v, key_pe), grad_out)
    for op in (spanformer.adaptive_span_attention, torch.ops.spanformer.adaptive_span_attention_reference):
        got, got_grads = value_and_grads(lambda q, k, v, key_pe: op(q, k, v, key_pe, span_ratio, L, R),
                                         (q, k, v, key_pe), grad_out)
        assert torch.allclose(got, want, atol=1e-12, rtol=0), (op, (got - want).abs().max())
        for name, a, b in zip(("q", "k", "v", "key_pe"), got_grads, want_grads):
            assert torch.allclose(a, b, atol=1e-11, rtol=0), (op, name, (a - b).abs().max())

    from torch.nn.attention import flex_attention as fa
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True  # eager on the CPU (the benchmark compiles it)
    with torch.no_grad():
        pos, log_m, _, z = span_terms(q, key_pe, span_ratio, L, R)
        visited = torch.clamp(torch.floor(z.view(-1) + R) + 1, max=L)  # (K): distances each head reads

        def in_window(b, h, i, j):
            return (i + L - j >= 1) & (i + L - j <= L)

        def in_span(b, h, i, j):
            return (i + L - j >= 1) & (i + L - j <= visited[h])

        def with_mask(score, b, h, i, j):
            return score + pos[b, h, i, j] + log_m[0, h, i, j]

        def without_mask(score, b, h, i, j):
            return score + pos[b, h, i, j]

        q, k, v = q.detach(), k.detach(), v.detach()
        B, K, M, _ = q.shape
        spans = fa.create_block_mask(in_span, None, K, M, k.shape[2], device="cpu")
        window = fa.create_block_mask(in_window, None, K, M, k.shape[2], device="cpu")
        flex, lse_m = fa.flex_attention(q, k, v, score_mod=with_mask, block_mask=spans, return_lse=True)
        _, lse_all = fa.flex_attention(q, k, v, score_mod=without_mask, block_mask=window, return_lse=True)
        flex = flex * (1 / (1 + 1e-8 * torch.exp(lse_all - lse_m))).unsqueeze(-1)
    assert torch.allclose(flex, want, atol=1e-12, rtol=0), (flex - want).abs().max()


# ---- 4. transformers: the GPT-2 layout --------------------------------------------------------------

def hf_gpt2(path):
    import transformers
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager")
    return model.eval()


def greedy(logits_of, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(logits_of(ids)[-1].argmax()))
    return ids


def dense_gpt_run(cli, byte_data, tmp, name, *extra):
    run = os.path.join(tmp, name)
    if not os.path.isdir(run):
        cli("train", "-c", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gpt", "demo.json"),
            "--data", byte_data, "--out", run, "--n_layer=2", "--d_model=32", "--n_head=2", "--context=64",
            "--batch_size=4", "--eval_interval=60", "--eval_blocks=2", "--lr_warmup=5", "--eval_batch_size=4",
            "--attention=dense", "--quiet", *extra)
    return run


@pytest.mark.parametrize("variant", [
    ("random", "--nb_steps=1", "--lr=1e-12", "--lr_min=0"),              # the initial weights
    ("trained", "--nb_steps=60", "--lr=3e-3"),                            # trained here
    ("untied_tanh", "--nb_steps=60", "--lr=3e-3", "--tie_weights=false", "--activation=gelu_tanh", "--d_inner=48"),
], ids=lambda v: v[0])
def test_gpt2_layout_both_ways(variant, cli, byte_data, tmp, tmp_path):
    """export gpt2 -> transformers' GPT2LMHeadModel: the same logits (1e-5) and greedy tokens; then the
    directory the library saves back (save_pretrained) -> import gpt2 -> the same logits again."""
    run = dense_gpt_run(cli, byte_data, tmp, "gpt2_" + variant[0], *variant[1:])
    ours = spanformer.load(run)
    out = str(tmp_path / "hf")
    cli("export", "gpt2", run, "-o", out)
    theirs = hf_gpt2(out)
    rng = random.Random(7)
    V = len(ours.vocab)
    ids = [rng.randrange(V) for _ in range(64)]
    with torch.no_grad():
        hf_logits = theirs(torch.tensor([ids])).logits[0]
    mine = ours.logits(ids)
    assert mine.shape == hf_logits.shape == (64, V)
    assert torch.allclose(mine, hf_logits, atol=1e-5, rtol=0), (mine - hf_logits).abs().max()
    with torch.no_grad():
        want = greedy(lambda x: theirs(torch.tensor([x])).logits[0], ids[:8], 30)
    assert greedy(ours.logits, ids[:8], 30) == want

    saved = str(tmp_path / "saved")
    theirs.save_pretrained(saved)  # the library's own directory: its config.json and model.safetensors
    for name in ("vocab.txt",):
        open(os.path.join(saved, name), "w").write(open(os.path.join(out, name)).read())
    back = str(tmp_path / "back.pt")
    cli("import", "gpt2", saved, "-o", back)
    again = spanformer.load(back).logits(ids)
    assert torch.allclose(again, hf_logits, atol=1e-5, rtol=0), (again - hf_logits).abs().max()
    assert torch.equal(again, mine)  # the same weights, bit for bit, after the round trip


def test_a_transformers_users_gpt2_opens_in_generate(cli, byte_data, tmp_path):
    """A GPT-2 a transformers user built and saved (their config: gelu_new, untied head, n_inner), over
    this byte vocabulary: import gpt2 with --vocab, then generate greedily (top_k 1) as the library does."""
    import transformers
    vocab = os.path.join(byte_data, "vocab.txt")
    V = sum(1 for _ in open(vocab))
    config = transformers.GPT2Config(vocab_size=V, n_positions=48, n_embd=24, n_layer=3, n_head=3, n_inner=40,
                                     tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(3)
    model = transformers.GPT2LMHeadModel(config).eval()
    saved = str(tmp_path / "user")
    model.save_pretrained(saved)
    checkpoint = str(tmp_path / "user.pt")
    cli("import", "gpt2", saved, "--vocab", vocab, "-o", checkpoint)
    tokens = [line.rstrip("\n") for line in open(vocab)]
    prompt = "It was"
    ids = [tokens.index(str(b)) for b in prompt.encode()]
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, pad_token_id=0)[0].tolist()
    text = cli("generate", checkpoint, "--prompt", prompt, "--tokens", "20", "--top-k", "1")
    decode = lambda i: "\n" if tokens[i] == "<eos>" else bytes([int(tokens[i])]).decode("latin-1")  # noqa: E731
    assert text == "".join(decode(i) for i in want) + "\n", (text, want)


def trained_bpe(shared, where, vocab_size=2000):
    """A byte-level BPE trained here by `tokenizers` (GPT-2's kind: ByteLevel pre-tokenizer, no prefix
    space, <|endoftext|> as an added token) on 2 MB of Dickens: saved as tokenizer.json and as vocab.json
    + merges.txt in `where`. Returns the Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    text = open(os.path.join(shared, "data", "dickens.txt"), encoding="utf-8", errors="replace").read()[:2_000_000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 10000] for i in range(0, len(text), 10000)], trainer)
    os.makedirs(where, exist_ok=True)
    tok.save(os.path.join(where, "tokenizer.json"))
    tok.model.save(where)
    return tok


BPE_TEXTS = [
    "It was the best of times, it was the worst of times; it's I'd we'll they've you're she's.",
    "  runs   of spaces\n\n\tand tabs \t  \n",
    "naïve café, 東京タワー, Ελληνικά, 😀 emoji, ünïcödé.",
    "<|endoftext|>between two<|endoftext|>",
    " a leading space and a trailing one ",
    "digits 3.14159 and 1,000,000 and 42nd",
    "'quoted' don't 'S 'LL", "", "x" * 300, "no\u00a0break\u2003em space\u200bzero width",
]


def test_gpt2_byte_level_bpe_encodes_and_decodes_as_tokenizers_does(cli, shared, tmp_path):
    """`spanformer data tokenize` against the tokenizers library, on a byte-level BPE that library trained
    (2000 tokens): the same ids for text with unicode, runs of whitespace, contractions, digits and the
    added token, read from tokenizer.json and from vocab.json + merges.txt alike; decoding the library's
    ids gives the text back; bytes that are not UTF-8 (which the library cannot take) come back exactly;
    a missing or foreign tokenizer is one line."""
    tok = trained_bpe(shared, str(tmp_path / "bpe"))
    for i, text in enumerate(BPE_TEXTS):
        (tmp_path / f"t{i}.txt").write_bytes(text.encode())
        want = tok.encode(text).ids
        got_json = [int(x) for x in cli("data", "tokenize", "--tokenizer", str(tmp_path / "bpe" / "tokenizer.json"),
                                        str(tmp_path / f"t{i}.txt")).split()]
        assert got_json == want, (text, got_json[:30], want[:30])
        (tmp_path / f"ids{i}.txt").write_text(" ".join(map(str, want)))
        done = subprocess.run([cli.path, "data", "tokenize", "--tokenizer", str(tmp_path / "bpe" / "tokenizer.json"),
                               "--decode", str(tmp_path / f"ids{i}.txt")], capture_output=True, check=True)
        assert done.stdout == text.encode()
    merges_only = tmp_path / "merges_only"
    merges_only.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (merges_only / name).write_bytes((tmp_path / "bpe" / name).read_bytes())
    for i, text in enumerate(BPE_TEXTS):
        got = [int(x) for x in cli("data", "tokenize", "--tokenizer", str(merges_only), str(tmp_path / f"t{i}.txt")).split()]
        assert got == tok.encode(text).ids, text
    raw = b"ab\xff\xfecd \x80x \xe2\x82 end\xc3"
    (tmp_path / "raw.bin").write_bytes(raw)
    ids = cli("data", "tokenize", "--tokenizer", str(tmp_path / "bpe"), str(tmp_path / "raw.bin"))
    (tmp_path / "raw.ids").write_text(ids)
    back = subprocess.run([cli.path, "data", "tokenize", "--tokenizer", str(tmp_path / "bpe"), "--decode",
                           str(tmp_path / "raw.ids")], capture_output=True, check=True).stdout
    assert back == raw
    (tmp_path / "foreign.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    for path, said in ((tmp_path / "nothing", "no such file or directory"), (merges_only.parent / "t0.txt", "not JSON"),
                       (tmp_path / "foreign.json", "the model is not BPE")):
        done = subprocess.run([cli.path, "data", "tokenize", "--tokenizer", str(path), str(tmp_path / "t0.txt")],
                              capture_output=True, text=True)
        assert done.returncode != 0 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_transformers_gpt2_with_its_tokenizer_generates_text_as_transformers_does(cli, shared, tmp_path):
    """A GPT-2 saved by transformers with its byte-level BPE tokenizer (tokenizer.json, vocab.json,
    merges.txt): import gpt2 keeps the tokenizer (no --vocab), and generate takes a text prompt and prints
    transformers' greedy continuation, decoded as its tokenizer decodes; export gpt2 writes the tokenizer
    back, and the re-imported model generates the same."""
    import transformers
    saved = tmp_path / "user"
    tok = trained_bpe(shared, str(saved))
    config = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(5)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(str(saved))
    checkpoint = str(tmp_path / "user.pt")
    cli("import", "gpt2", str(saved), "-o", checkpoint)
    prompt = "It was the best of times, it was"
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=15, do_sample=False, pad_token_id=0)[0, len(ids):]
    text = cli("generate", checkpoint, "--prompt", prompt, "--tokens", "15", "--top-k", "1")
    assert text == prompt + tok.decode(want.tolist()) + "\n", (text, tok.decode(want.tolist()))  # the prompt, then the tokens
    exported = str(tmp_path / "exported")
    cli("export", "gpt2", checkpoint, "-o", exported)
    assert json.load(open(os.path.join(exported, "tokenizer.json"))) == json.load(open(saved / "tokenizer.json"))
    again = str(tmp_path / "again.pt")
    cli("import", "gpt2", exported, "-o", again)
    assert cli("generate", again, "--prompt", prompt, "--tokens", "15", "--top-k", "1") == text


# ---- 5. transformers: its models on our attention (spanformer.hf) -------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_transformers_models_on_our_flash_attention_give_eagers_logits_and_tokens(kind):
    """GPT-2 (also with scores divided by the layer number: a `scaling` other than D^-1/2), a Llama with
    grouped-query attention and a Mistral with 8-key sliding windows (shorter than the 40 tokens, so the
    band matters), attn_implementation="spanformer" against transformers' eager, each model built from
    its own config and checked to run what it says (hf_pair): logits within 1e-5 (float32 rounding of the
    same sums in another order) and the same 20 greedy tokens through generate(), which runs the KV cache
    (one query against C keys)."""
    eager, ours = hf_pair(kind)
    ids = prompt_ids()
    with torch.no_grad():
        want, got = eager(ids).logits, ours(ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
        prompt = ids[:1, :6]
        args = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
        assert torch.equal(ours.generate(prompt, **args), eager.generate(prompt, **args))
    if kind == "mistral":  # the band is what makes them equal: the same model with dense attention differs
        eager.config.sliding_window = None
        with torch.no_grad():
            assert (eager(ids).logits - got).abs().max() > 1e-3
    if kind == "gpt2_layer_scaled":  # the layer's scaling is what makes them equal: without it they differ
        plain = hf_model("gpt2", "eager")
        plain.load_state_dict(eager.state_dict())
        with torch.no_grad():
            assert (plain(ids).logits - got).abs().max() > 1e-3


def test_transformers_refusals_are_one_line_value_errors():
    """What spanformer.hf cannot compute is a ValueError that names the way out, never other numbers: a
    layer made bidirectional (the module's is_causal, or is_causal=False passed down), attention weights
    asked for (output_attentions=True, which eager returns)."""
    eager, ours = hf_pair("llama")
    ids = prompt_ids()[:1, :8]
    with torch.no_grad():
        assert len(eager(ids, output_attentions=True).attentions) == 2  # what a user asking for them gets from eager
        with pytest.raises(ValueError, match=r"^spanformer: attention weights are never formed; use attn_implementation='eager'"):
            ours(ids, output_attentions=True)
        layer = next(m for m in ours.modules() if hasattr(m, "is_causal"))
        layer.is_causal = False
        with pytest.raises(ValueError, match=r"^spanformer: only causal self-attention is supported.*'sdpa'"):
            ours(ids)
        layer.is_causal = True
        from spanformer.hf import _attention
        q = torch.randn(1, 4, 3, 16)
        with pytest.raises(ValueError, match="only causal self-attention"):
            _attention(layer, q, q, q, None, is_causal=False)
        assert ours(ids).logits.shape == (1, 8, 97)  # the layer restored: it runs again


def test_transformers_models_with_soft_capping_and_sinks_give_eagers_logits_and_packed_rows_are_refused():
    """Gemma 2 (scores tanh-capped: `softcap`; its own query scale; sliding-window layers) and GPT-OSS (a
    learned sink logit per head: `s_aux`; grouped-query heads; sliding windows) on our attention against
    eager: logits within 1e-5 and, for a fine-tuning step, every gradient (the sinks' included) within
    1e-4 of eager's largest. Without the cap the logits differ (so the cap is what makes them equal). A
    batch of packed sequences (position_ids restarting within the row, which FlashAttention-2 would split)
    is a one-line ValueError."""
    import copy
    import transformers
    import spanformer.hf
    spanformer.hf.register()
    ids = prompt_ids()[:1, :24]

    def pair(config, cls):
        torch.manual_seed(5)
        eager = cls._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
        ours = cls._from_config(copy.deepcopy(config), attn_implementation="spanformer").eval()
        ours.load_state_dict(eager.state_dict())
        return eager, ours

    def same(eager, ours, what):
        want, got = eager(ids).logits, ours(ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (what, (got - want).abs().max())
        for model in (eager, ours):
            model.zero_grad()
            model(ids, labels=ids).loss.backward()
        for (name, a), (_, b) in zip(eager.named_parameters(), ours.named_parameters()):
            scale = a.grad.abs().max().item() + 1e-12
            assert (a.grad - b.grad).abs().max().item() <= 1e-4 * scale, (what, name)
        return got

    gemma = transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, sliding_window=8, query_pre_attn_scalar=24,
                                      attn_logit_softcapping=2.0)
    eager, ours = pair(gemma, transformers.Gemma2ForCausalLM)
    for model in (eager, ours):  # larger scores, so that the cap of 2 bends them
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.data.mul_(8)
    capped = same(eager, ours, "gemma2")
    uncapped = copy.deepcopy(gemma)
    uncapped.attn_logit_softcapping = None
    plain, _ = pair(uncapped, transformers.Gemma2ForCausalLM)
    plain.load_state_dict(eager.state_dict())
    with torch.no_grad():
        assert (plain(ids).logits - capped).abs().max() > 1e-3
    oss = transformers.GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=128, sliding_window=8)
    eager, ours = pair(oss, transformers.GptOssForCausalLM)
    for model in (eager, ours):
        for layer in model.model.layers:
            layer.self_attn.sinks.data.normal_(generator=torch.Generator().manual_seed(1)).mul_(2)
    same(eager, ours, "gpt-oss")
    assert ours.model.layers[0].self_attn.sinks.grad.abs().max() > 0
    with torch.no_grad():
        eager, ours = hf_pair("llama")
        packed = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]])
        with pytest.raises(ValueError, match=r"^spanformer: packed sequences \(position_ids restarting within a row\)"):
            ours(ids[:, :12], position_ids=packed)
        straight = torch.arange(12)[None]
        assert torch.allclose(ours(ids[:, :12], position_ids=straight).logits,
                              eager(ids[:, :12], position_ids=straight).logits, atol=1e-5, rtol=0)


# Padded batches: four rows of 20 tokens (longer than Mistral's 8-key window): unpadded, left-padded by 5,
# right-padded after 13, and left-padded but for the last token.
PADDING = ((0, 20), (5, 20), (0, 13), (19, 20))


def padded_batch():
    """(ids, mask): (4, 20) each, 0 in ids where mask is 0."""
    mask = torch.zeros(len(PADDING), 20, dtype=torch.long)
    for b, (first, end) in enumerate(PADDING):
        mask[b, first:end] = 1
    return prompt_ids()[:1, :20].repeat(len(PADDING), 1) * mask, mask


@pytest.mark.parametrize("kind", ("gpt2", "llama", "mistral"))
def test_transformers_padded_batches_give_eagers_logits_gradients_and_tokens(kind):
    """A padded batch through attn_implementation="spanformer" (the mask becomes the op's key_ranges):
    at every real token, float32 logits within 1e-5 of eager's (the same sums in another order), and the
    gradients of a fine-tuning step (cross-entropy on the real tokens that follow a real token) within
    1e-4 relative; bfloat16
    logits no farther from eager's float32 than twice eager's own bfloat16 (plus its rounding); greedy
    generation of a left-padded batch gives eager's tokens and each row's tokens generated alone."""
    eager, ours = hf_pair(kind)
    ids, mask = padded_batch()
    real = mask.bool()
    with torch.no_grad():
        want, got = eager(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert torch.allclose(got[real], want[real], atol=1e-5, rtol=0), (got - want)[real].abs().max()
    assert (ours(ids).logits[real] - got[real]).abs().max() > 1e-3  # the mask is not ignored
    # The first real token of a row is not predicted (it would be read from a padded position, whose
    # output eager fills with an average of the row and FlashAttention-2, as the op, with 0).
    labels = ids.masked_fill(~real, -100)
    labels[torch.arange(len(PADDING)), torch.tensor([f for f, _ in PADDING])] = -100
    grads = []
    for model in (eager, ours):
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, atol=1e-4 * (1 + g.abs().max().item()), rtol=0), name
    with torch.no_grad():
        half_eager, half_ours = (hf_model(kind, impl).to(torch.bfloat16) for impl in ("eager", "spanformer"))
        half_eager.load_state_dict(eager.state_dict())
        half_ours.load_state_dict(eager.state_dict())
        own = (half_eager(ids, attention_mask=mask).logits.float() - want)[real].abs().max()
        ours_err = (half_ours(ids, attention_mask=mask).logits.float() - want)[real].abs().max()
        assert ours_err <= 2 * own + 0.05, (ours_err, own)
        left = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 9, 3]])
        left_mask = (torch.arange(8) >= torch.tensor([3, 0, 6])[:, None]).long()
        args = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
        batched = ours.generate(left, attention_mask=left_mask, **args)
        assert torch.equal(batched, eager.generate(left, attention_mask=left_mask, **args))
        for b in range(3):
            alone = ours.generate(left[b:b + 1, left_mask[b].bool()], **args)
            assert torch.equal(batched[b, 8:], alone[0, alone.shape[1] - 12:]), b


def test_transformers_masks_other_than_padding_are_refused_by_name():
    """A 4-D causal mask with padding is taken like the 2-D one (eager's logits); a mask with a hole
    inside a row (a 0 between two 1s) or a 4-D mask of another pattern is a ValueError that names the
    way out, not silently other logits."""
    eager, ours = hf_pair("llama")
    ids, mask = padded_batch()
    real = mask.bool()
    causal = torch.tril(torch.ones(20, 20, dtype=torch.bool))
    four = causal[None, None] & real[:, None, None, :] & real[:, None, :, None]  # (4, 1, 20, 20)
    with torch.no_grad():
        want = eager(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=four).logits
        assert torch.allclose(got[real], want[real], atol=1e-5, rtol=0), (got - want)[real].abs().max()
        holed = mask.clone()
        holed[0, 7] = 0
        with pytest.raises(ValueError, match=r"^spanformer: this attention_mask is not a causal mask with padding.*'sdpa'"):
            ours(ids, attention_mask=holed)
        bidirectional = real[:, None, None, :] & real[:, None, :, None]
        with pytest.raises(ValueError, match=r"^spanformer: this attention_mask is not a causal mask with padding"):
            ours(ids, attention_mask=bidirectional)
