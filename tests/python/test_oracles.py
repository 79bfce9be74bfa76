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

import pytest
import sacrebleu
import safetensors.torch
import torch
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

import spanformer

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
