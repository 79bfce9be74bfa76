"""spanformer beside what a user would pick instead in PyTorch 2.x, on the CPU or on
a GPU (the training rows in bf16): FlexAttention, scaled_dot_product_attention and
torch.compile, one process, interleaved rounds, medians.

    SPANFORMER_TORCH_OPS=build/libspanformer_torch_ops.so SPANFORMER_CLI=build/spanformer \
        .venv/bin/python bench/python/peers.py [--rounds 3] [--rows gemm,span,flash,gpt] [--threads 2]
    ... peers.py --device cuda --rows gpt,lm,seq2seq     (scripts/gpu-check.sh peers)
    ... peers.py --amp bf16 --rows gpt,lm,seq2seq        (the CPU training rows in bf16: the twins under
                                                          CPU autocast, ours with train.amp=bf16)

With --device cuda the training rows (gpt, lm, seq2seq) run on the GPU under bf16 autocast, ours as
`spanformer --device cuda bench --amp=bf16 --steps 10 --warmup 3` (its ms per step), the twins timed
with a device synchronisation around each step; the operator rows on a GPU are gpu_compare.py's and
gpu_flash.py's.

Each round times every implementation of a row once, one after another, so that the shared machine's
drift falls on all of them alike; a row prints the median of each over the rounds. What is timed:

  gemm    the ceiling: torch.mm of two 2048 x 2048 float32 matrices (GFLOP/s)
  span    the adaptive-span operator, B 1, K 8, D 64, M 512, L 8192, float32, spans bimodal (3 of 4
          heads in [16, 256], 1 of 4 in [2048, L], the spans adaptive span learns) and all at L:
            ours      spanformer.adaptive_span_attention (the fused CPU kernel), forward + backward
            eager     the reference's formula in PyTorch (the op's plain composition, written below)
            compiled  the same function under torch.compile
            flex      FlexAttention, torch.compile'd, score_mod = score + position + log m and each
                      head's span as the block mask (made once, outside the timing): the exact
                      function up to the 1e-8 Z term (tests/python/test_oracles.py), forward only
                      (FlexAttention has no backward on the CPU); ours forward beside it
  flash   causal attention, B 1, K 8, D 64, T 1k / 4k / 16k, forward + backward, float32 and bfloat16
          inputs (--flash-lengths, --flash-dtypes):
            ours      spanformer.flash_attention (the fused CPU kernel, no T x T tensor); bf16 rows also
                      with the kind of 16-bit products `auto` does not pick on this CPU (native bf16
                      operands where it lacks AMX, widened to float32 where it has it)
            sdpa      scaled_dot_product_attention(is_causal=True): PyTorch's CPU flash kernel
  gpt     a GPT training step (forward, backward, global clipping at 1, AdamW), 4 layers x 4 heads, H 256, bytes, T 1k (batch
          8) and 4k (batch 2), dense, window 128 and adaptive span attention (bimodal spans):
            ours      `spanformer bench --json` (configs/gpt/bench_attention.json), its ms per step
            eager     the same model in PyTorch (nanoGPT's layout, models/gpt.h), SDPA with the mask
                      (adaptive span: the float mask log m, as FlexAttention cannot train on the CPU)
            compiled  that model under torch.compile (compile time excluded: warm-up steps first)

  lm      the adaptive-span language model's training step (forward, backward, clipped Adagrad, the
          caches carried): configs/bench_small.json (4 x 4, H 256, L 1024, M 256, batch 8) at spans 40 and
          540, and configs/bench_span8k.json (2 x 8, H 512, L 8192, M 512, batch 1) with bimodal spans:
            ours      `spanformer bench --json`
            eager     bench/python/reference_semantics.py's model (the reference's operations: skew by
                      padding, memory trimmed to the largest span, per-tensor clipped Adagrad)
            compiled  that model's forward under torch.compile
            eager fp32  (--amp bf16, CPU) that model's eager step without autocast, beside our bf16 step
  seq2seq the encoder-decoder Transformer's training step, configs/seq2seq/transformer.json (3 + 3 blocks
          of H 256, 4 heads, FFN 1024, dropout 0.1, shared 16000-word table, 8000 target words, label
          smoothing 0.1, Adam; batch 128 pairs of 16 + 17 tokens):
            ours      `spanformer bench --json`
            eager     torch.nn.Transformer of the same sizes (post-norm), the same embeddings and loss
            compiled  that model under torch.compile

  hf      a transformers GPT-2 (12 x 768, 12 heads, V 50257, random weights) scoring a batch of 8, forward
          under torch.no_grad (--hf-lengths T, default 128, 512 and 1024; --hf-dtypes float32,bfloat16):
            ours padded    attn_implementation="spanformer" on a left-padded batch: row b holds
                           T - b T / 16 real tokens (T down to 9 T / 16), the rest padding (the mask
                           becomes the op's key_ranges)
            ours unpadded  the same model on 8 unpadded rows of the padded batch's mean length (the
                           same real tokens, within 8): the padded path's cost beside it
            sdpa           attn_implementation="sdpa" on the padded batch (transformers' default)
            and the attention alone, forward + backward, as the model calls it (B 8, 12 heads of 64): the
            op on the padded batch (key_ranges), on the unpadded batch of the same real tokens, and
            scaled_dot_product_attention with the padded causal mask (what transformers' sdpa passes)
          checked: ours and sdpa give the same logits at every real token (1e-3 in float32 relative to
          the largest, 0.1 in bfloat16), else a MISMATCH line and a non-zero exit
  generate greedy decoding, batch 1 and 8 (--generate-batches: rows decoded together, each its own prompt of
          Dickens), a prompt of 128 tokens then 256 new tokens, float32 and bfloat16
          (--generate-dtypes: ours `--dtype bfloat16`, transformers' model.to(bfloat16), llama.cpp's GGUF
          in bf16), of a GPT-2 of 4 x 256 (4 heads) and of 12 x 768 (12 heads) (--generate-shapes) with
          each vocabulary of --generate-vocabs: V 256, bytes, weights of one training step
          (configs/gpt/bench_attention.json's model) exported with `export gpt2`; V 50257, GPT-2's size, a
          byte-level BPE of GPT-2's kind trained here by `tokenizers` on Dickens, a transformers GPT-2 of
          random weights saved with it and imported with `import gpt2`:
            ours          `spanformer bench --mode generate --context 384 --tokens 256 --recompute 0 --batch B`:
                          tokens/s of the 256 steps with the KV cache (the prompt not counted), and of the
                          prompt at once (prefill: the hidden states, the last token's logits)
            transformers  GPT2LMHeadModel.from_pretrained of the export, eager attention, its dynamic
                          cache: generate(max_new_tokens=256) less generate(max_new_tokens=1), as 255 tokens
            compiled      the same with sdpa attention, its static cache (sized once for the longest call)
                          and generate's torch.compile of the decoding step (CompileConfig(mode="default"),
                          asked for on the CPU; the compilation not timed); in float32 its 64 greedy tokens
                          must be the eager run's (else MISMATCH)
            sdpa          prefill beside ours: the prompt through the model with sdpa attention into a
                          fresh cache, the last token's logits (logits_to_keep=1)
            llama.cpp     (--generate-peers llama; the BPE rows: llama.cpp reads a model with its tokenizer)
                          llama-cpp-python (scripts/install-peers.sh: built by pip for this CPU) on the GGUF
                          that llama.cpp's own converter writes from the transformers directory (f32 or
                          bf16), 255 steps after the prompt, each next token the argmax: batch 1 through
                          its Llama class, several rows through llama.cpp's batch API (llama_decode of
                          one token a sequence; the Llama class decodes one sequence)
          checked: `spanformer generate --top-k 1`, llama.cpp and transformers' greedy generate give the
          same 64 tokens after the same prompt in float32 (batch 8: llama.cpp's rows those of transformers'
          batch; ours' rows: GptModel.BatchedDecodingGivesEachRowAlone), and llama.cpp's logits on the prompt are
          transformers' within 1e-3 of the largest, else a MISMATCH line and a non-zero exit (in bfloat16
          each rounds its own way: how many agree is printed); these rows print
          tokens/s, and their ratio is ours / transformers (> 1: ours faster, as elsewhere)
            the bound     the memory bandwidth (torch summing 512 MB: bytes read a second) over the bytes
                          of weights a step reads (all but the position table), times the batch: the
                          tokens/s of a step that did nothing but read its weights once; ratio ours / bound
  example the Python example's training step (examples/python/nanogpt_adaptive_span.py: 4 blocks of H 256,
          4 heads, L 512, M 128, batch 16, the caches carried, Adam, clipping at 1; each layer's spans
          fixed at 26, 77, 154 and 230 tokens, so that no step changes a cache size):
            ours      the example's model: spanformer.nn.AdaptiveSpanAttention, eager and torch.compile'd
            eager     the same model and weights with PyTorch's own attention instead: SDPA over the L'
                      cached states and the block, the float mask (q . key_pe) / sqrt(D) + log m
            compiled  that model under torch.compile
          (--amp bf16: all four under bf16 autocast)
Prints a Markdown table (milliseconds per call or step; ratio = peer / ours, > 1 means ours is faster).
"""
import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import spanformer  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_semantics import Model as ReferenceLm, skew, unskew  # noqa: E402


DEVICE = torch.device("cpu")  # --device: where the twins run; on CUDA under bf16 autocast


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


AMP = False  # --amp bf16: the CPU training rows under bf16 autocast (ours with train.amp=bf16)


def autocast():
    """bf16 autocast on CUDA, and on the CPU with --amp bf16 (ours runs with train.amp=bf16 then)."""
    return torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=DEVICE.type == "cuda" or AMP)


def timed(fn, warmup=1):
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def interleave(impls, rounds, warmup):
    """impls: {name: callable}; returns {name: median ms} over rounds, each round every impl once."""
    times = {name: [] for name in impls}
    for name, fn in impls.items():  # warm-up (and compilation) before the first timed round
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in impls.items():
            times[name].append(timed(fn, warmup=0))
    return {name: statistics.median(t) for name, t in times.items()}, times


def bench_ms(cli, threads, *args):
    """`spanformer bench ... --json` (one timed step after two warm-up steps, as the twins are warmed up
    by two; on CUDA ten after three, in bf16): its record (ms_per_step, params, first_loss, peak_rss_mb,
    ...)."""
    where = ["--steps", "1", "--warmup", "2"] + (["--amp=bf16"] if AMP else [])
    if DEVICE.type == "cuda":
        where = ["--steps", "10", "--warmup", "3", "--amp=bf16"]
    out = subprocess.run([cli, "--threads", str(threads), "--device", str(DEVICE), "bench", *args, *where, "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


MEMORY = False  # --memory: each training row's twins also run alone in a process of their own (peak RSS)


def beside_ours(ours, recipe, rounds, what, span_params=0):
    """Our step (a fresh `spanformer bench` process each round, its own timer) and the PyTorch twins
    (compiled and warmed up by two steps first), each once per round; medians in ms. Ours runs once
    first (untimed): the twins are made from its record (our spans) by recipe = (maker, arguments) and
    checked against it (check_twin). With --memory, also peak RSS in MB as "<name> MB"."""
    first = ours()
    impls, facts = TWIN_MAKERS[recipe[0]](*recipe[1], first)
    if MEMORY:
        memory = {f"{name} MB": twin_peak_rss(recipe, first, name) for name in impls}
    check_twin(what, first, facts, span_params)
    records = []
    for fn in impls.values():
        fn()
        fn()
    times = {"ours": [], **{name: [] for name in impls}}
    for _ in range(rounds):
        records.append(ours())
        times["ours"].append(records[-1]["ms_per_step"])
        for name, fn in impls.items():
            times[name].append(timed(fn, warmup=0))
    med = {name: statistics.median(t) for name, t in times.items()}
    if MEMORY:
        med.update(memory, **{"ours MB": max(r["peak_rss_mb"] for r in records)})
    return med


def memory_rows(what, med):
    """With --memory: peak RSS rows (MB; ratio = twin / ours, above 1: ours needs less)."""
    for peer in ("eager", "compiled"):
        if f"{peer} MB" in med:
            print(f"| {what}, peak RSS MB | {med['ours MB']:.0f} | {peer} | {med[f'{peer} MB']:.0f} | "
                  f"{med[f'{peer} MB'] / med['ours MB']:.2f} |", flush=True)


def twin_peak_rss(recipe, record, name):
    """The peak RSS (MB) of a fresh Python process that builds the twin `name` of recipe and runs three
    of its steps (ours: three steps, `spanformer bench --steps 1 --warmup 2`), torch and compilation in it."""
    spec = json.dumps({"recipe": recipe, "record": record, "name": name, "amp": AMP, "device": str(DEVICE),
                       "threads": torch.get_num_threads()})
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--twin-memory", spec], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def run_twin_alone(spec):
    """--twin-memory: the child of twin_peak_rss."""
    global AMP, DEVICE
    s = json.loads(spec)
    AMP, DEVICE = s["amp"], torch.device(s["device"])
    torch.set_num_threads(s["threads"])
    impls, _ = TWIN_MAKERS[s["recipe"][0]](*s["recipe"][1], s["record"])
    for _ in range(3):
        impls[s["name"]]()
    # VmHWM, this process's own peak: getrusage's maximum includes the parent's size at fork (Linux).
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"peak_rss_mb": int(hwm.split()[1]) * 1024 / 1e6}))


MISMATCHES = []  # the twins that are not our model: main() exits non-zero after the table


def check_twin(what, ours, twin, span_params):
    """That the twin is our model: the same number of parameters (ours may hold span_params more: the
    spans, which the twin keeps fixed in its mask) and the same mean NLL on its first batch, before any
    update (in nats; both initialised by the same rule with different draws, on different random
    batches: within 2%, where a wrong initialisation, vocabulary or loss is off by far more)."""
    extra = ours["params"] - twin["params"]
    loss_gap = abs(ours["first_loss"] - twin["first_loss"]) / twin["first_loss"]
    ok = 0 <= extra <= span_params and loss_gap <= 0.02
    print(f"# twin check, {what}: parameters ours {ours['params']:,}, twin {twin['params']:,}"
          f"{f' (ours: +{extra} span parameters)' if extra and extra <= span_params else ''}; first-step NLL ours "
          f"{ours['first_loss']:.4f}, twin {twin['first_loss']:.4f} ({100 * loss_gap:.2f}%): {'ok' if ok else 'MISMATCH'}",
          flush=True)
    if not ok:
        MISMATCHES.append(what)


def twin_facts(model, first_loss):
    return {"params": sum(p.numel() for p in model.parameters()), "first_loss": float(first_loss)}


# ---- the GEMM ceiling ----------------------------------------------------------------------------

def gemm_ceiling(rounds):
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    med, _ = interleave({"mm": lambda: torch.mm(a, b)}, rounds * 3, 2)
    return 2 * 2048 ** 3 / (med["mm"] * 1e-3) / 1e9


# ---- the span operator ---------------------------------------------------------------------------

def bimodal_spans(K, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    spans = []
    for h in range(K):
        lo, hi = (16, min(256, L)) if h % 4 != 3 else (min(2048, L), L)
        spans.append(lo + (hi - lo) * torch.rand(1, generator=g).item())
    return spans


def span_reference(q, k, v, key_pe, span_ratio, L, R):
    """The op's plain composition in PyTorch (include/spanformer/ops/adaptive_span_attention.h, the
    reference's operations): scores over the whole window (query i reads key rows i .. i + L - 1,
    distances L .. 1) by unskewing q k^T, softmax, the soft mask m_d = clamp((R + z - (d - 1)) / R, 0, 1),
    renormalised by sum + 1e-8, skewed back and multiplied by the values."""
    B, K, M, D = q.shape
    W = L
    scores = unskew((q @ k.transpose(-1, -2)).view(B * K, M, W + M)).view(B, K, M, W)  # column c = distance W - c
    p = ((scores + q @ key_pe) / math.sqrt(D)).softmax(-1)
    distance_minus_one = torch.arange(W - 1, -1, -1, dtype=q.dtype)
    m = ((span_ratio * L).view(K, 1, 1) - distance_minus_one) / R + 1
    w = p * m.clamp(0, 1)
    a = w / (w.sum(-1, keepdim=True) + 1e-8)
    return skew(a.view(B * K, M, W)).view(B, K, M, W + M) @ v


def span_row(pattern, rounds):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B, K, D, M, L, R = 1, 8, 64, 512, 8192, 32.0
    spans = bimodal_spans(K, L) if pattern == "bimodal" else [float(L)] * K
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, K, M, D, generator=g).requires_grad_()
    k = torch.randn(B, K, L + M, D, generator=g).requires_grad_()
    v = torch.randn(B, K, L + M, D, generator=g).requires_grad_()
    pe = (0.1 * torch.randn(D, L, generator=g)).requires_grad_()
    ratio = torch.tensor([s / L for s in spans])
    grad = torch.randn(B, K, M, D, generator=g)

    def fwd_bwd(f):
        def run():
            out = f(q, k, v, pe, ratio, L, R)
            torch.autograd.grad(out, (q, k, v, pe), grad)
        return run

    compiled = torch.compile(span_reference, dynamic=False)
    visited = [max(1, min(L, math.floor(s + R) + 1)) for s in spans]
    visited_t = torch.tensor(visited)
    z = torch.tensor(spans)

    def score_mod(score, b, h, i, j):
        d = i + L - j  # 1 .. L inside the window; the block mask keeps only 1 .. S_h, but whole
        m = torch.clamp((R + z[h] - (d - 1)) / R, 0.0, 1.0)  # blocks are scored, so the index is clamped
        return score + flex_pos[0][b, h, i, torch.clamp(L - d, 0, L - 1)] + torch.log(m)

    def in_span(b, h, i, j):
        return (i + L - j >= 1) & (i + L - j <= visited_t[h])

    block = create_block_mask(in_span, None, K, M, L + M, device="cpu")  # once: the spans are fixed here
    flex_pos = [None]

    def flex_forward():
        with torch.no_grad():
            flex_pos[0] = q @ pe / math.sqrt(D)  # (B, K, M, L): distance d at column L - d
            return flex_compiled(q.detach(), k.detach(), v.detach(), score_mod=score_mod, block_mask=block)

    flex_compiled = torch.compile(flex_attention, dynamic=False)
    impls = {"ours": fwd_bwd(lambda *a: spanformer.adaptive_span_attention(*a)),
             "eager": fwd_bwd(span_reference), "compiled": fwd_bwd(compiled),
             "ours fwd": lambda: spanformer.adaptive_span_attention(q.detach(), k.detach(), v.detach(), pe.detach(), ratio, L, R),
             "flex fwd": flex_forward}
    med, _ = interleave(impls, rounds, 1)
    return med, visited


# ---- causal flash attention ----------------------------------------------------------------------

def flash_impls(T, dtype=torch.float32):
    """{ours, sdpa}: forward + backward of causal attention, B 1, K 8, D 64, inputs in dtype."""
    B, K, D = 1, 8, 64
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, K, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(B, K, T, D, generator=g).to(dtype)

    def fwd_bwd(f):
        def run():
            torch.autograd.grad(f(q, k, v), (q, k, v), grad)
        return run

    impls = {"ours": fwd_bwd(lambda q, k, v: spanformer.flash_attention(q, k, v)),
             "sdpa": fwd_bwd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))}
    if dtype != torch.float32:  # ours with the other kind of 16-bit products than `auto` picks on this CPU
        other = "widened" if spanformer.cpu_half_products() == "native" else "native"

        def run_other():
            spanformer.cpu_half_products(other)
            try:
                impls["ours"]()
            finally:
                spanformer.cpu_half_products("auto")
        impls[f"ours {other}"] = run_other
    return impls


def flash_row(T, rounds, dtype=torch.float32):
    med, _ = interleave(flash_impls(T, dtype), rounds, 1)
    return med


# ---- transformers' GPT-2 on padded batches ----------------------------------------------------------

def hf_row(T, rounds, dtype):
    """{name: median ms} of the hf rows (the module docstring) at length T, and the largest logit
    difference of ours from sdpa at real tokens, relative to the largest logit."""
    import transformers
    import spanformer.hf
    transformers.logging.set_verbosity_error()
    spanformer.hf.register()
    config = transformers.GPT2Config(n_positions=max(1024, T), n_embd=768, n_layer=12, n_head=12)
    torch.manual_seed(0)
    models = {impl: transformers.GPT2LMHeadModel._from_config(copy.deepcopy(config), attn_implementation=impl)
              for impl in ("spanformer", "sdpa")}
    models["sdpa"].load_state_dict(models["spanformer"].state_dict())
    for m in models.values():
        m.eval().to(dtype)
    B = 8
    lengths = [T - b * T // 16 for b in range(B)]
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, T - n:] = 1
    ids = torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(1)) * mask
    mean = round(sum(lengths) / B)
    flat = torch.randint(0, config.vocab_size, (B, mean), generator=torch.Generator().manual_seed(2))
    real = mask.bool()
    with torch.no_grad():
        ours, sdpa = (models[i](ids, attention_mask=mask).logits.float() for i in ("spanformer", "sdpa"))
    diff = ((ours - sdpa)[real].abs().max() / sdpa[real].abs().max()).item()

    def run(impl, x, m):
        def fn():
            with torch.no_grad():
                models[impl](x, attention_mask=m)
        return fn
    med, _ = interleave({"ours padded": run("spanformer", ids, mask), "ours unpadded": run("spanformer", flat, None),
                         "sdpa": run("sdpa", ids, mask)}, rounds, 1)
    # The attention alone, as the model calls it (12 heads of 64): forward + backward of the padded batch
    # (key_ranges), of the unpadded batch of the same real tokens, and SDPA with the padded causal mask.
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, 12, T, 64, generator=g).to(dtype).requires_grad_() for _ in range(3))
    qf, kf, vf = (torch.randn(B, 12, mean, 64, generator=g).to(dtype).requires_grad_() for _ in range(3))
    ranges = torch.tensor([[T - n, T] for n in lengths])
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None] & real[:, None, None, :]  # (B, 1, T, T)
    allowed = allowed | ~real[:, None, :, None]  # padded queries read every key (no row without one: no NaN)

    def step(fn):
        def run_step():
            fn().float().sum().backward()
        return run_step
    op, _ = interleave({
        "op padded": step(lambda: spanformer.flash_attention(q, k, v, key_ranges=ranges)),
        "op unpadded": step(lambda: spanformer.flash_attention(qf, kf, vf)),
        "op sdpa": step(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)),
    }, rounds, 1)
    med.update(op)
    return med, diff


# ---- greedy decoding beside transformers --------------------------------------------------------------

# llama.cpp's converter run on a Hugging Face directory (argv: converter folder, model folder, outtype,
# GGUF file). The BPE was trained here, so its pre-tokenizer's hash is no known model's: it is GPT-2's
# (the ByteLevel pre-tokenizer with GPT-2's pattern), and that is the name the converter is given.
LLAMA_CONVERT = """
import runpy, sys
conv, model_dir, outtype, out = sys.argv[1:5]
sys.path[:0] = [conv, conv + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = [conv + "/convert_hf_to_gguf.py", model_dir, "--outtype", outtype, "--outfile", out]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def llama_model(hf_dir, dtype, threads, work):
    """llama.cpp (llama-cpp-python) on the GGUF its own converter writes from hf_dir, f32 or bf16."""
    gguf = llama_gguf(hf_dir, dtype, work)  # refuses in one line where llama.cpp is not installed
    from llama_cpp import Llama
    return Llama(model_path=gguf, n_ctx=384, n_batch=512, n_threads=threads,
                 n_threads_batch=threads, logits_all=True, verbose=False)


def llama_gguf(hf_dir, dtype, work):
    """The GGUF (f32 or bf16) llama.cpp's own converter writes from hf_dir, made once in work."""
    conv = os.path.join(sys.prefix, "llama.cpp")
    try:
        from llama_cpp import Llama
    except ImportError:
        Llama = None
    if Llama is None or not os.path.isfile(os.path.join(conv, "convert_hf_to_gguf.py")):
        sys.exit("peers: the llama.cpp peer is not installed in this environment: bash scripts/install-peers.sh")
    outtype = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    gguf = os.path.join(work, f"{os.path.basename(hf_dir)}.{outtype}.gguf")
    if not os.path.exists(gguf):
        subprocess.run([sys.executable, "-c", LLAMA_CONVERT, conv, hf_dir, outtype, gguf], check=True, capture_output=True)
    return gguf


def llama_greedy(llm, ids, n):
    """llama.cpp's n greedy tokens after ids, and the logits (len(ids), V) of the prompt."""
    import numpy as np
    llm.reset()
    llm.eval(ids)
    prompt_logits = torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out, prompt_logits


def llama_batched(gguf, rows, steps, threads):
    """llama.cpp decoding len(rows) prompts together through its batch API (llama-cpp-python's Llama decodes
    one sequence): the prompts at once, then `steps` steps of one token a row, each the row's argmax.
    Returns (tokens/s of the steps, rows x steps / time; each row's greedy tokens)."""
    import numpy as np
    import llama_cpp as L
    from llama_cpp._utils import suppress_stdout_stderr  # llama.cpp's logs, as Llama(verbose=False) quiets them
    B, P = len(rows), len(rows[0])
    with suppress_stdout_stderr(disable=False):
        model = L.llama_model_load_from_file(gguf.encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx = B * (P + steps + 8)
    params.n_batch = params.n_ubatch = B * P
    params.n_seq_max = B
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = threads
    with suppress_stdout_stderr(disable=False):
        ctx = L.llama_init_from_model(model, params)
    V = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(B * P, 0, B)
    try:
        def decode(tokens, pos):  # tokens[b]: row b's next tokens at positions pos..; logits of each row's last
            n = 0
            for b, row in enumerate(tokens):
                for i, t in enumerate(row):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = t, pos + i, 1
                    batch.seq_id[n][0] = b
                    batch.logits[n] = i == len(row) - 1
                    n += 1
            batch.n_tokens = n
            if L.llama_decode(ctx, batch) != 0:
                sys.exit("peers: llama.cpp could not decode the batch")
            width = len(tokens[0])
            return [int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, (b + 1) * width - 1), shape=(V,)).argmax())
                    for b in range(B)]
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        nxt = decode(rows, 0)
        greedy = [[t] for t in nxt]
        start = time.perf_counter()
        for i in range(steps):
            nxt = decode([[t] for t in nxt], P + i)
            for b in range(B):
                greedy[b].append(nxt[b])
        return B * steps / (time.perf_counter() - start), greedy
    finally:
        with suppress_stdout_stderr(disable=False):
            L.llama_batch_free(batch)
            L.llama_free(ctx)
            L.llama_model_free(model)


def trained_bpe(where, vocab_size):
    """A byte-level BPE of vocab_size tokens trained here by `tokenizers` on Dickens (GPT-2's kind: the
    ByteLevel pre-tokenizer, no prefix space, <|endoftext|> as an added token), saved as tokenizer.json and
    vocab.json + merges.txt in `where`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    text = open(os.path.join(ROOT, "..", "shared", "data", "dickens.txt"), encoding="utf-8", errors="replace").read()
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


def generate_models(layers, width, vocab, cli, threads, work):
    """The row's models: (hf_dir, our checkpoint or run, encode(text) -> ids, decode(ids) -> text). Bytes (V
    256): ours trained one step on Dickens and exported with `export gpt2`; a BPE of `vocab` tokens: a
    transformers GPT-2 with random weights saved with the tokenizer, imported with `import gpt2`."""
    import transformers
    config = os.path.join(ROOT, "configs", "gpt", "bench_attention.json")
    shape = [f"--n_layer={layers}", f"--d_model={width}", f"--n_head={width // 64}", "--context=384"]
    hf_dir = os.path.join(work, f"hf{layers}x{width}v{vocab}")
    if vocab == 256:
        data = os.path.join(work, "data")
        if not os.path.isdir(data):
            text = os.path.join(work, "text.txt")
            with open(os.path.join(ROOT, "..", "shared", "data", "dickens.txt"), "rb") as f:
                open(text, "wb").write(f.read(300000))
            subprocess.run([cli, "data", "prepare", text, "--out", data], check=True, capture_output=True)
        run = os.path.join(work, f"run{layers}x{width}")
        if not os.path.isdir(run):
            subprocess.run([cli, "--threads", str(threads), "train", "-c", config, "--data", data, "--out", run, *shape,
                            "--nb_steps=1", "--batch_size=1", "--eval_interval=1", "--eval_blocks=1", "--lr_warmup=0",
                            "--eval_batch_size=1", "--quiet"], check=True, capture_output=True)
        if not os.path.isdir(hf_dir):
            subprocess.run([cli, "export", "gpt2", run, "-o", hf_dir], check=True, capture_output=True)
        tokens = [line.rstrip("\n") for line in open(os.path.join(hf_dir, "vocab.txt"))]
        encode = lambda text: [tokens.index("<eos>") if ch == "\n" else tokens.index(str(ord(ch))) for ch in text]  # noqa: E731
        decode = lambda ids: "".join("\n" if tokens[i] == "<eos>" else chr(int(tokens[i])) for i in ids)  # noqa: E731
        return hf_dir, run, encode, decode
    bpe = os.path.join(work, f"bpe{vocab}")
    tok = trained_bpe(bpe, vocab) if not os.path.isdir(bpe) else __import__("tokenizers").Tokenizer.from_file(
        os.path.join(bpe, "tokenizer.json"))
    if not os.path.isdir(hf_dir):
        torch.manual_seed(5)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=tok.get_vocab_size(), n_positions=384, n_embd=width, n_layer=layers, n_head=width // 64))
        model.save_pretrained(hf_dir)
        # GPT-2's own config.json carries n_ctx beside n_positions, which llama.cpp's converter reads;
        # transformers 5 no longer writes it
        with open(os.path.join(hf_dir, "config.json")) as f:
            hf_config = json.load(f)
        hf_config["n_ctx"] = hf_config["n_positions"]
        with open(os.path.join(hf_dir, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        for name in ("tokenizer.json", "vocab.json", "merges.txt"):
            with open(os.path.join(bpe, name), "rb") as f:
                open(os.path.join(hf_dir, name), "wb").write(f.read())
    run = os.path.join(work, f"run{layers}x{width}v{vocab}.pt")
    if not os.path.exists(run):
        subprocess.run([cli, "import", "gpt2", hf_dir, "-o", run], check=True, capture_output=True)
    return hf_dir, run, lambda text: tok.encode(text).ids, lambda ids: tok.decode(list(ids))


def agreeing(want, got):
    """How many tokens of `want` the other list starts with."""
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))


def generate_row(layers, width, rounds, cli, threads, work, dtype="float32", vocab=256, peers=("llama",), batch=1):
    """{name: median tokens/s} for the generate rows (the module docstring) in `dtype` at `batch` rows, and
    (batch 1) how many of the 64 greedy tokens of each peer agree with transformers' eager run (ours and
    llama.cpp: all, to pass, in float32), and llama.cpp's largest logit difference from transformers' on
    the prompt (of the largest)."""
    import transformers
    transformers.logging.set_verbosity_error()
    hf_dir, run, encode, decode = generate_models(layers, width, vocab, cli, threads, work)
    config = os.path.join(ROOT, "configs", "gpt", "bench_attention.json")
    shape = [f"--n_layer={layers}", f"--d_model={width}", f"--n_head={width // 64}", "--context=384", f"--vocab_size={vocab}"]
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    model = model.to(getattr(torch, dtype))
    model.generation_config.eos_token_id = None  # every row decodes all its tokens (<eos> is a newline in bytes)
    dickens = open(os.path.join(ROOT, "..", "shared", "data", "dickens.txt"), "rb").read()
    text = dickens[1000:1128].decode("latin-1")
    ids = encode(text)
    agree, logit_diff = {}, None
    if batch == 1:
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, pad_token_id=0)[0, len(ids):]
            want_logits = model(torch.tensor([ids])).logits[0].float()  # (len(ids), V)
        want = want.tolist()
        ours_text = subprocess.run([cli, "--threads", str(threads), "generate", run, "--prompt", text, "--tokens", "64",
                                    "--top-k", "1", "--dtype", dtype], check=True,
                                   capture_output=True).stdout.decode("latin-1" if vocab == 256 else "utf-8", "replace")
        # ours prints the prompt, then its tokens as text: the agreeing tokens are the longest prefix of want
        # whose text ours printed
        cont = ours_text[len(text):]
        agree["ours"] = 64 if ours_text == text + decode(want) + "\n" else max(
            (k for k in range(65) if cont.startswith(decode(want[:k]))), default=0)

    def prompt_of(b):  # 128 tokens of Dickens, row b from its own place
        row = encode(dickens[1000 + 4000 * b:1000 + 4000 * b + 1024].decode("latin-1"))
        return row[:128] if len(row) >= 128 else (row * 128)[:128]
    prompt = torch.tensor([prompt_of(b) for b in range(batch)])  # (batch, 128)
    # transformers' fastest decoding: its static cache (one size for every call: no recompilation) and each
    # decoding step's forward under torch.compile (generate compiles it; on the CPU when asked to).
    compiled = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="sdpa").eval()
    compiled = compiled.to(getattr(torch, dtype))
    compiled.generation_config.eos_token_id = None
    compiled.generation_config.cache_implementation = "static"
    compiled.generation_config.max_cache_len = 128 + 256
    compile_config = transformers.CompileConfig(mode="default")
    compile_config._compile_all_devices = True
    compiled.generation_config.compile_config = compile_config
    with torch.no_grad():  # compiles (minutes on 2 cores), then the check
        compiled.generate(prompt, max_new_tokens=256, do_sample=False, pad_token_id=0)
        if batch == 1:
            agree["compiled"] = agreeing(want, compiled.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                                                 pad_token_id=0)[0, len(ids):].tolist())
    # transformers' prefill: the prompt through SDPA attention into a fresh cache, the last token's logits
    sdpa = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="sdpa").eval()
    sdpa = sdpa.to(getattr(torch, dtype))

    def theirs(m=model):  # 256 tokens less the prompt and the first: 255 steps with the cache, each row
        with torch.no_grad():
            start = time.perf_counter()
            m.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0)
            first = time.perf_counter() - start
            start = time.perf_counter()
            m.generate(prompt, max_new_tokens=256, do_sample=False, pad_token_id=0)
            return {"decode": 255 * batch / (time.perf_counter() - start - first)}

    def their_prefill():
        with torch.no_grad():
            start = time.perf_counter()
            sdpa(prompt, use_cache=True, logits_to_keep=1).logits.sum().item()
            return {"prefill": 128 * batch / (time.perf_counter() - start)}

    def ours():
        out = subprocess.run([cli, "--threads", str(threads), "bench", "-c", config, *shape, "--mode", "generate",
                              "--tokens", "256", "--steps", "1", "--warmup", "1", "--dtype", dtype, "--recompute", "0",
                              "--batch", str(batch), "--json"],
                             check=True, capture_output=True, text=True)
        record = json.loads(out.stdout.strip().splitlines()[-1])
        return {"decode": record["cached_tokens_per_s"], "prefill": record["prefill_tokens_per_s"]}

    impls = {"ours": ours, "transformers": theirs, "compiled": lambda: theirs(compiled), "sdpa": their_prefill}
    if "llama" in peers and vocab != 256 and batch > 1:  # several sequences: llama.cpp's batch API
        gguf = llama_gguf(hf_dir, dtype, work)
        with torch.no_grad():
            want_rows = model.generate(prompt, max_new_tokens=64, do_sample=False, pad_token_id=0)[:, 128:].tolist()
        greedy = llama_batched(gguf, prompt.tolist(), 63, threads)[1]
        agree["llama.cpp"] = min(agreeing(w, g) for w, g in zip(want_rows, greedy))  # the row agreeing least
        impls["llama.cpp"] = lambda: {"decode": llama_batched(gguf, prompt.tolist(), 255, threads)[0]}
    if "llama" in peers and vocab != 256 and batch == 1:  # llama.cpp reads a model with its tokenizer: the BPE rows
        import numpy as np
        llm = llama_model(hf_dir, dtype, threads, work)
        greedy, logits = llama_greedy(llm, ids, 64)
        agree["llama.cpp"] = agreeing(want, greedy)
        logit_diff = ((logits - want_logits).abs().max() / want_logits.abs().max()).item()

        def llama():  # 255 steps after the prompt, as transformers' rows count them
            llm.reset()
            llm.eval(prompt[0].tolist())
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            start = time.perf_counter()
            for _ in range(255):
                llm.eval([token])
                token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            return {"decode": 255 / (time.perf_counter() - start)}
        impls["llama.cpp"] = llama
    for fn in impls.values():
        fn()  # warm
    rates = {}
    for _ in range(rounds):
        for name, fn in impls.items():
            for what, rate in fn().items():
                rates.setdefault(f"{name} {what}", []).append(rate)
    med = {name: statistics.median(r) for name, r in rates.items()}
    # What a decoding step must read: every weight once (the position table: one row; the output layer
    # is the embedding, tied, counted once).
    med["weight bytes"] = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "wpe" not in name)
    return med, agree, logit_diff


def stream_bandwidth(rounds=9, size=1 << 27):
    """The machine's memory bandwidth for reading, as torch sums a 512 MB float32 tensor on the threads set
    (bytes read a second, median of `rounds`): what a decoding step that reads its weights once can at
    best have."""
    src = torch.ones(size)
    src.sum()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        src.sum()
        times.append(time.perf_counter() - start)
    return size * 4 / statistics.median(times)


def cpu_line():
    """The CPU's model name, the vector ISA ATen's kernels use, its bf16 hardware (AMX, AVX512-BF16 or
    none), from /proc/cpuinfo and torch, and how our attention kernels multiply bf16 inputs on it."""
    name, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    bf16 = "AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else "none"
    return (f"{name}, {torch.backends.cpu.get_cpu_capability()}, bf16 products: {bf16} "
            f"(spanformer's attention kernels: {spanformer.cpu_half_products()} bf16 products)")


# ---- a GPT training step ---------------------------------------------------------------------------

class Block(nn.Module):
    """models/gpt.h's block: pre-norm, fused qkv, GELU (exact) MLP of 4 H."""

    def __init__(self, H, K, window):
        super().__init__()
        self.K, self.window = K, window
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x, mask):
        B, N, H = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, N, 3, self.K, H // self.K).permute(2, 0, 3, 1, 4)
        if mask is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask.dtype == torch.bool else mask.to(q.dtype))
        x = x + self.proj(a.transpose(1, 2).reshape(B, N, H))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    """window 0: dense (SDPA's causal kernel); window > 0: SDPA with the band as a boolean mask;
    spans (per layer, one z per head: ours, from `spanformer bench --json`): adaptive span, SDPA with the
    float mask log m_z(d) (-inf beyond the span), one (K, T, T) mask per layer: softmax(s + log m) is the
    GPT family's formula (attention/causal_attention.h), the soft mask inside the softmax."""

    def __init__(self, V, T, H, K, layers, window, spans=None, ramp=32.0, init_std=0.02):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(T, H)
        self.blocks = nn.ModuleList(Block(H, K, window) for _ in range(layers))
        self.ln_f = nn.LayerNorm(H)
        with torch.no_grad():  # models/gpt.h's initialisation (GPT-2's)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.normal_(0, init_std)
                if isinstance(m, nn.Linear):
                    m.bias.zero_()
            for b in self.blocks:
                b.proj.weight.normal_(0, init_std / math.sqrt(2 * layers))
                b.fc2.weight.normal_(0, init_std / math.sqrt(2 * layers))
        i = torch.arange(T)
        d = i.unsqueeze(1) - i.unsqueeze(0) + 1  # (T, T): distance, 1 = the query itself
        if spans is not None:
            z = torch.tensor(spans).view(layers, -1, 1, 1)
            mask = ((ramp + z - (d - 1)) / ramp).clamp(0, 1).log().masked_fill(d < 1, float("-inf"))  # (layers, K, T, T)
        else:
            mask = None if window == 0 else (d >= 1) & (d <= window)  # (T, T), every layer
        self.register_buffer("mask", mask)

    def forward(self, x, y):
        h = self.wte(x) + self.wpe.weight[: x.shape[1]]
        for i, b in enumerate(self.blocks):
            h = b(h, self.mask if self.mask is None or self.mask.dim() == 2 else self.mask[i])
        logits = self.ln_f(h) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))


def gpt_twins(attention, T, batch, ours):
    """{eager, compiled}: the PyTorch GPT's training step (the same sizes, optimizer and loss; our spans,
    from our record `ours`), and its facts for check_twin."""
    V, H, K, layers, window = 256, 256, 4, 4, 128
    spans = ours["spans"] if attention == "adaptive_span" else None
    model = Gpt(V, T, H, K, layers, window if attention == "window" else 0, spans).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-9, betas=(0.9, 0.95), weight_decay=0.1)  # the gpt defaults
    x = torch.randint(V, (batch, T), device=DEVICE)
    y = torch.randint(V, (batch, T), device=DEVICE)
    with torch.no_grad(), autocast():
        facts = twin_facts(model, model(x, y).item())

    def step(loss_fn):
        def run():
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # train.grad_clip
            opt.step()
        return run

    return {"eager": step(model), "compiled": step(torch.compile(model))}, facts


def gpt_row(attention, T, batch, rounds, cli, threads):
    config = os.path.join(ROOT, "configs", "gpt", "bench_attention.json")
    span_args = ["--span-dist", "bimodal"] if attention == "adaptive_span" else []

    def ours():
        return bench_ms(cli, threads, "-c", config, f"--attention={attention}", f"--context={T}",
                        f"--batch_size={batch}", *span_args)

    return beside_ours(ours, ("gpt", [attention, T, batch]), rounds, f"GPT T {T} {attention}",
                       span_params=16 if attention == "adaptive_span" else 0)


# ---- the adaptive-span language model -------------------------------------------------------------

def lm_twins(config_name, ours):
    """{eager, compiled}: reference_semantics.py's model, its training step, with our spans (from our
    record `ours`), and its facts for check_twin."""
    whole = json.load(open(os.path.join(ROOT, "configs", config_name)))
    c, B = {**whole["model"], **whole.get("run", {})}, whole["train"]["batch_size"]
    V, H, K, I, L, M, layers = 256, c["hidden_size"], c["nb_heads"], c["inner_hidden_size"], c["attn_span"], c["block_size"], c["nb_layers"]
    torch.manual_seed(0)
    model = ReferenceLm(V, H, K, I, L, layers, 32, 0.0)
    with torch.no_grad():
        for index, layer in enumerate(model.layers):
            layer.ratio.copy_(torch.tensor(ours["spans"][index]).view(K, 1, 1) / L)
    model.to(DEVICE)
    params = list(model.parameters())
    sums = [torch.zeros_like(q) for q in params]
    state = {"caches": [torch.zeros(B, layer.cache_size(), H, device=DEVICE) for layer in model.layers]}
    compiled = torch.compile(model)
    with torch.no_grad(), autocast():
        x, y = torch.randint(V, (B, M), device=DEVICE), torch.randint(V, (B, M), device=DEVICE)
        out, _ = model(x, state["caches"])
        facts = twin_facts(model, F.nll_loss(out.view(-1, V).float(), y.view(-1)).item())

    def step(net, amp=True):
        st = state if amp else {"caches": [c.float() for c in state["caches"]]}  # its own float32 caches

        def run():
            x, y = torch.randint(V, (B, M), device=DEVICE), torch.randint(V, (B, M), device=DEVICE)
            for q in params:
                q.grad = None
            with autocast() if amp else contextlib.nullcontext():
                out, st["caches"] = net(x, st["caches"])
                loss = F.nll_loss(out.view(-1, V).float(), y.view(-1)) + sum(2e-6 * L * layer.ratio.mean() for layer in model.layers)
            loss.backward()
            with torch.no_grad():
                for q, s in zip(params, sums):  # Adagrad, per-tensor clip at 0.03 (the reference's
                    n = q.grad.norm()            # optimizer; the clip factor kept on the device)
                    lr = 1e-9 * torch.where(n > 0.03, 0.03 / (n + 1e-10), torch.ones_like(n))
                    s.addcmul_(q.grad, q.grad)
                    q.sub_(lr * q.grad / s.sqrt().add_(1e-10))
            loss.item()
        return run

    impls = {"eager": step(model), "compiled": step(compiled)}
    if AMP and DEVICE.type == "cpu":  # the twin's float32 eager step beside our bf16 one (the 3x target)
        impls["eager fp32"] = step(model, amp=False)
    return impls, facts


def lm_row(config_name, spans, rounds, cli, threads):
    span_args = ["--span-dist", "bimodal"] if spans == "bimodal" else ["--span", str(spans)]

    def ours():
        return bench_ms(cli, threads, "-c", os.path.join(ROOT, "configs", config_name), *span_args)

    return beside_ours(ours, ("lm", [config_name]), rounds, f"LM {config_name[:-5]} span {spans}")


# ---- the encoder-decoder Transformer ----------------------------------------------------------------

class Seq2seq(nn.Module):
    """models/seq2seq.h's Transformer: shared embedding table scaled by sqrt(H), sinusoidal positions,
    post-norm encoder and decoder (no final LayerNorm), output = the table's first Vt rows plus a bias."""

    def __init__(self, V, Vt, H, K, I, layers, dropout):
        super().__init__()
        self.H, self.Vt = H, Vt
        self.emb = nn.Embedding(V, H)
        # Post-norm blocks and no final LayerNorm after either stack (nn.Transformer adds one by default).
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(H, K, I, dropout, batch_first=True), layers,
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(H, K, I, dropout, batch_first=True), layers)
        self.core = nn.Transformer(H, K, custom_encoder=encoder, custom_decoder=decoder, batch_first=True)
        self.out_bias = nn.Parameter(torch.zeros(Vt))
        pos = torch.arange(512).unsqueeze(1) * torch.exp(torch.arange(0, H, 2) * (-math.log(10000.0) / H))
        self.register_buffer("pe", torch.stack([pos.sin(), pos.cos()], -1).view(512, H))
        self.drop = nn.Dropout(dropout)
        with torch.no_grad():  # models/seq2seq.h's initialisation: the table N(0, H^-1/2), matrices
            for name, w in self.named_parameters():  # Xavier-uniform, biases 0, norms as they are
                if name.startswith("emb"):
                    w.normal_(0, H ** -0.5)
                elif w.dim() >= 2:
                    nn.init.xavier_uniform_(w)
                elif "norm" not in name:
                    w.zero_()

    def embed(self, x):
        return self.drop(self.emb(x) * math.sqrt(self.H) + self.pe[: x.shape[1]])

    def forward(self, x, y_in, y_out, label_smoothing=0.1):
        T = y_in.shape[1]
        causal = torch.triu(torch.full((T, T), float("-inf"), device=x.device), 1)
        h = self.core(self.embed(x), self.embed(y_in), tgt_mask=causal)
        logits = h @ self.emb.weight[: self.Vt].t() + self.out_bias
        return F.cross_entropy(logits.reshape(-1, self.Vt), y_out.reshape(-1), label_smoothing=label_smoothing)


def seq2seq_twins():
    """{eager, compiled}: nn.Transformer's training step with configs/seq2seq/transformer.json's sizes."""
    c = json.load(open(os.path.join(ROOT, "configs", "seq2seq", "transformer.json")))
    m, B, N = {**c["model"], **c.get("run", {})}, c["train"]["batch_size"], c["data"]["max_length"]
    V, Vt = 16000, 8000  # `spanformer bench`'s sizes for this family
    torch.manual_seed(0)
    model = Seq2seq(V, Vt, m["d_model"], m["n_head"], m["d_inner"], m["n_layer"], m["dropout"]).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-9, betas=(0.9, 0.98))
    compiled = torch.compile(model)
    with torch.no_grad(), autocast():  # in training mode: dropout on, as in our first step
        x, y = torch.randint(4, V, (B, N), device=DEVICE), torch.randint(4, Vt, (B, N + 2), device=DEVICE)
        facts = twin_facts(model, model(x, y[:, :-1], y[:, 1:], label_smoothing=0.0).item())

    def step(net):
        def run():
            x = torch.randint(4, V, (B, N), device=DEVICE)
            y = torch.randint(4, Vt, (B, N + 2), device=DEVICE)
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = net(x, y[:, :-1], y[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        return run

    return {"eager": step(model), "compiled": step(compiled)}, facts


def seq2seq_row(rounds, cli, threads):
    config = os.path.join(ROOT, "configs", "seq2seq", "transformer.json")

    def ours():
        return bench_ms(cli, threads, "-c", config)

    return beside_ours(ours, ("seq2seq", []), rounds, "seq2seq Transformer")


# ---- the Python example: spanformer.nn inside a plain PyTorch model ---------------------------------

def sdpa_span_forward(self, h, cache, key_pe):
    """spanformer.nn.AdaptiveSpanAttention.forward with PyTorch's attention in place of our op: SDPA with
    the relative positions and log m as its float mask (the op's function up to the 1e-8 Z term)."""
    B, M, H = h.shape
    K, D, Lp, L = self.nb_heads, H // self.nb_heads, self.span.used_span(), self.span.attn_span
    kept = cache[:, max(0, cache.shape[1] - Lp):]
    if kept.shape[1] < Lp:
        kept = torch.cat([kept.new_zeros(B, Lp - kept.shape[1], H), kept], 1)
    context = torch.cat([kept, h], 1)                                                  # (B, L' + M, H)
    q = self.proj_query(h).view(B, M, K, D).transpose(1, 2)                            # (B, K, M, D)
    k = self.proj_key(context).view(B, Lp + M, K, D).transpose(1, 2)                   # (B, K, L' + M, D)
    v = self.proj_val(context).view(B, Lp + M, K, D).transpose(1, 2)
    # Query i reads context rows i .. i + L' - 1 (distances L' .. 1): its L' biases skewed into place.
    bias = (q @ key_pe[:, L - Lp:].to(q.dtype)) / math.sqrt(D) \
        + self.span.mask(Lp).clamp_min(1e-30).log().to(q.dtype).unsqueeze(1)             # (B, K, M, L')
    bias = F.pad(bias.reshape(B * K, M, Lp), (0, M + 1), value=float("-inf"))
    bias = bias.reshape(B * K, -1)[:, : M * (Lp + M)].view(B, K, M, Lp + M)            # (B, K, M, L' + M)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)                      # (B, K, M, D)
    return self.proj_out(out.transpose(1, 2).reshape(B, M, H))


def example_row(rounds):
    """{ours eager, ours compiled, eager, compiled}: the example's training step, medians in ms, and the
    largest difference between the two models' attention outputs (the same weights and input), relative
    to the largest output."""
    import copy
    import importlib.util
    import types
    spec = importlib.util.spec_from_file_location("nanogpt_adaptive_span",
                                                  os.path.join(ROOT, "examples", "python", "nanogpt_adaptive_span.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    B, M, L = 16, 128, 512
    ours = example.AdaptiveSpanGpt(4, 256, 4, L)
    with torch.no_grad():
        for block in ours.blocks:
            block.attn.span.span_ratio.copy_(torch.tensor([26.0, 77.0, 154.0, 230.0]) / L)
            block.attn.span.sync_host()
    twin = copy.deepcopy(ours)
    for block in twin.blocks:
        block.attn.forward = types.MethodType(sdpa_span_forward, block.attn)
    x, y = torch.randint(256, (B, M)), torch.randint(256, (B, M))
    with torch.no_grad():  # one attention layer of each in float32, a full cache: the same function
        h, cache = torch.randn(B, M, 256), torch.randn(B, ours.blocks[0].attn.cache_size(), 256)
        a, b = ours.blocks[0].attn(h, cache, ours.key_pe), twin.blocks[0].attn(h, cache, twin.key_pe)
        first = ((a - b).abs().max() / b.abs().max()).item()

    def step(model, net):
        spans = [b.attn.span.span_ratio for b in model.blocks]
        params = [q for q in model.parameters() if all(q is not r for r in spans)]  # spans fixed: see above
        opt = torch.optim.Adam(params, lr=3e-4)
        state = {"caches": model.zero_caches(B)}

        def run():
            with autocast():
                logp, state["caches"] = net(x, state["caches"])
                loss = F.nll_loss(logp.reshape(-1, 256).float(), y.reshape(-1)) + model.span_loss()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        return run

    impls = {"ours eager": step(ours, ours), "ours compiled": step(ours, torch.compile(ours)),
             "eager": step(twin, twin), "compiled": step(twin, torch.compile(twin))}
    med, _ = interleave(impls, rounds, warmup=3)
    return med, first


# How beside_ours (and a --twin-memory child) makes each row's twins: (arguments..., our record).
TWIN_MAKERS = {"gpt": lambda attention, T, batch, record: gpt_twins(attention, T, batch, record),
               "lm": lambda config_name, record: lm_twins(config_name, record),
               "seq2seq": lambda record: seq2seq_twins()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="gemm,span,flash,gpt,lm,seq2seq")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--gpt-lengths", default="1024:8,4096:2")
    parser.add_argument("--flash-lengths", default="1024,4096,16384")
    parser.add_argument("--flash-dtypes", default="float32,bfloat16", help="the flash rows' input dtypes")
    parser.add_argument("--gpt-attentions", default="dense,window,adaptive_span")
    parser.add_argument("--hf-lengths", default="128,512,1024", help="the hf rows' lengths T")
    parser.add_argument("--generate-shapes", default="4x256,12x768", help="the generate rows' layers x width")
    parser.add_argument("--generate-dtypes", default="float32,bfloat16", help="the generate rows' weights and steps")
    parser.add_argument("--generate-batches", default="1,8", help="the generate rows' batch sizes (rows decoded together)")
    parser.add_argument("--generate-vocabs", default="256,50257",
                        help="the generate rows' vocabularies: 256 (bytes), or a BPE of that many tokens trained here")
    parser.add_argument("--generate-peers", default="llama",
                        help="the generate rows' peers beside transformers: llama (llama.cpp; scripts/install-peers.sh), or ''")
    parser.add_argument("--hf-dtypes", default="float32,bfloat16", help="the hf rows' model dtypes")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the training rows in bf16")
    parser.add_argument("--amp", default="off", choices=["off", "bf16"],
                        help="bf16: the CPU training rows under bf16 autocast, ours with train.amp=bf16")
    parser.add_argument("--memory", action="store_true",
                        help="also the training rows' peak RSS: ours from `spanformer bench`, each twin alone in a fresh process")
    parser.add_argument("--twin-memory", help=argparse.SUPPRESS)  # the child process of --memory
    args = parser.parse_args()
    if args.twin_memory:
        return run_twin_alone(args.twin_memory)
    global DEVICE, AMP, MEMORY
    MEMORY = args.memory
    DEVICE = torch.device(args.device)
    AMP = args.amp == "bf16"
    if DEVICE.type == "cuda" and set(args.rows.split(",")) - {"gpt", "lm", "seq2seq"}:
        parser.error("--device cuda times the training rows only (gpt, lm, seq2seq); the operators' GPU "
                     "figures are gpu_compare.py's and gpu_flash.py's")
    torch.set_num_threads(args.threads)
    cli = os.environ.get("SPANFORMER_CLI", os.path.join(ROOT, "build", "spanformer"))
    rows = args.rows.split(",")
    where = f"{torch.cuda.get_device_name()}, bf16 autocast" if DEVICE.type == "cuda" else f"{args.threads} threads"
    if AMP and DEVICE.type == "cpu":
        where += ", training rows under bf16 autocast (ours: train.amp=bf16)"
    print(f"# peers: torch {torch.__version__}, {where}, {args.rounds} rounds, medians (ms)")
    print(f"# CPU: {cpu_line()}")
    if "gemm" in rows:
        print(f"gemm ceiling: {gemm_ceiling(args.rounds):.1f} GFLOP/s (float32 2048^3 mm)", flush=True)
    print("| what | ours | peer | peer ms | ratio (peer / ours) |")
    print("|---|---|---|---|---|")
    if "span" in rows:
        for pattern in ("bimodal", "all at L"):
            med, visited = span_row(pattern, args.rounds)
            what = f"span op B 1 K 8 D 64 M 512 L 8192, {pattern} (visited {visited})"
            for peer in ("eager", "compiled"):
                print(f"| {what}, fwd+bwd | {med['ours']:.0f} | PyTorch {peer} | {med[peer]:.0f} | {med[peer] / med['ours']:.2f} |", flush=True)
            print(f"| {what}, forward | {med['ours fwd']:.0f} | FlexAttention (compiled) | {med['flex fwd']:.0f} | "
                  f"{med['flex fwd'] / med['ours fwd']:.2f} |", flush=True)
    if "flash" in rows:
        for dtype in args.flash_dtypes.split(","):
            for T in (int(t) for t in args.flash_lengths.split(",")):
                med = flash_row(T, args.rounds, getattr(torch, dtype))
                what = f"flash causal B 1 K 8 D 64 T {T} {dtype}, fwd+bwd"
                print(f"| {what} | {med['ours']:.0f} | SDPA (CPU flash) | {med['sdpa']:.0f} | {med['sdpa'] / med['ours']:.2f} |", flush=True)
                for name in (n for n in med if n.startswith("ours ")):  # the products auto does not pick here
                    print(f"| {what}, {name[5:]} 16-bit products | {med[name]:.0f} | SDPA (CPU flash) | {med['sdpa']:.0f} | "
                          f"{med['sdpa'] / med[name]:.2f} |", flush=True)
    if "gpt" in rows:
        for spec in args.gpt_lengths.split(","):
            T, batch = (int(s) for s in spec.split(":"))
            for attention in args.gpt_attentions.split(","):
                med = gpt_row(attention, T, batch, args.rounds, cli, args.threads)
                what = f"GPT 4x4 H 256 T {T} B {batch} {attention}{' 128' if attention == 'window' else ''}, train step"
                for peer in ("eager", "compiled"):
                    print(f"| {what} | {med['ours']:.0f} | PyTorch {peer} (SDPA) | {med[peer]:.0f} | {med[peer] / med['ours']:.2f} |", flush=True)
                memory_rows(what, med)
    if "lm" in rows:
        for config_name, spans in (("bench_small.json", 40), ("bench_small.json", 540), ("bench_span8k.json", "bimodal")):
            med = lm_row(config_name, spans, args.rounds, cli, args.threads)
            what = f"adaptive-span LM {config_name[:-5]} span {spans}, train step"
            for peer in ("eager", "compiled", "eager fp32"):
                if peer in med:
                    print(f"| {what} | {med['ours']:.0f} | PyTorch {peer} | {med[peer]:.0f} | {med[peer] / med['ours']:.2f} |", flush=True)
            memory_rows(what, med)
    if "seq2seq" in rows:
        med = seq2seq_row(args.rounds, cli, args.threads)
        for peer in ("eager", "compiled"):
            print(f"| seq2seq Transformer 3+3 H 256 B 128, train step | {med['ours']:.0f} | nn.Transformer {peer} | "
                  f"{med[peer]:.0f} | {med[peer] / med['ours']:.2f} |", flush=True)
        memory_rows("seq2seq Transformer 3+3 H 256 B 128, train step", med)
    if "hf" in rows:
        for dtype in args.hf_dtypes.split(","):
            for T in (int(t) for t in args.hf_lengths.split(",")):
                med, diff = hf_row(T, args.rounds, getattr(torch, dtype))
                close = diff <= (1e-3 if dtype == "float32" else 0.1)
                print(f"# twin check, hf T {T} {dtype}: logits of ours and sdpa at real tokens differ by {diff:.1e} "
                      f"of the largest: {'ok' if close else 'MISMATCH'}", flush=True)
                if not close:
                    MISMATCHES.append(f"hf T {T} {dtype}")
                what = f"transformers GPT-2 12 x 768, B 8 left-padded to T {T}, {dtype}, forward"
                print(f"| {what} | {med['ours padded']:.0f} | sdpa, same batch | {med['sdpa']:.0f} | "
                      f"{med['sdpa'] / med['ours padded']:.2f} |", flush=True)
                print(f"| {what} | {med['ours padded']:.0f} | ours unpadded, same real tokens | {med['ours unpadded']:.0f} | "
                      f"{med['ours unpadded'] / med['ours padded']:.2f} |", flush=True)
                what = f"its attention alone, B 8 K 12 D 64 left-padded to T {T}, {dtype}, fwd+bwd"
                print(f"| {what} | {med['op padded']:.1f} | SDPA, the padded mask | {med['op sdpa']:.1f} | "
                      f"{med['op sdpa'] / med['op padded']:.2f} |", flush=True)
                print(f"| {what} | {med['op padded']:.1f} | ours unpadded, same real tokens | {med['op unpadded']:.1f} | "
                      f"{med['op unpadded'] / med['op padded']:.2f} |", flush=True)
    if "generate" in rows:
        import tempfile
        peers = args.generate_peers.split(",") if args.generate_peers else []
        with tempfile.TemporaryDirectory() as work:
            for vocab in (int(v) for v in args.generate_vocabs.split(",")):
                for spec, dtype, batch in ((s, d, int(b)) for s in args.generate_shapes.split(",")
                                           for d in args.generate_dtypes.split(",") for b in args.generate_batches.split(",")):
                    layers, width = (int(x) for x in spec.split("x"))
                    med, agree, logit_diff = generate_row(layers, width, args.rounds, cli, args.threads, work, dtype, vocab,
                                                          peers, batch)
                    short = {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype)
                    name = f"generate {spec} V {vocab} {short}"
                    # float32: ours and llama.cpp must give transformers' 64 greedy tokens, and llama.cpp its
                    # logits (1e-3 of the largest); in bfloat16 each rounds its own way: reported
                    for peer, n in agree.items():
                        required = dtype == "float32" and peer != "compiled"
                        ok = n == 64 or not required
                        print(f"# {'twin check, ' if required else ''}{name}: {peer} gives the first {n} of transformers' "
                              f"64 greedy tokens{': ok' if ok and required else '' if ok else ': MISMATCH'}", flush=True)
                        if not ok:
                            MISMATCHES.append(f"{name} {peer}")
                    if logit_diff is not None:
                        ok = logit_diff <= 1e-3 or dtype != "float32"
                        print(f"# {name}: llama.cpp's logits on the prompt differ from transformers' by {logit_diff:.1e} "
                              f"of the largest{'' if ok else ': MISMATCH'}", flush=True)
                        if not ok:
                            MISMATCHES.append(f"{name} llama.cpp logits")
                    what = (f"greedy decoding, GPT-2 {layers} x {width}, V {vocab}, batch {batch}, 256 tokens after 128, "
                            f"{short} (tokens/s)")
                    ours = med["ours decode"]
                    # rates: the ratio is ours / peer, so that > 1 still means ours is faster
                    for peer, label in (("transformers", "transformers eager, dynamic cache"),
                                        ("compiled", "transformers static cache, torch.compile"),
                                        ("llama.cpp", "llama.cpp (llama-cpp-python 0.3.36), GGUF from its converter")):
                        if f"{peer} decode" in med:
                            print(f"| {what} | {ours:.0f} | {label} | {med[peer + ' decode']:.0f} | "
                                  f"{ours / med[peer + ' decode']:.2f} |", flush=True)
                    bandwidth = stream_bandwidth()
                    bound = bandwidth / med["weight bytes"] * batch
                    print(f"| {what} | {ours:.0f} | the bandwidth bound: {med['weight bytes'] / 1e6:.1f} MB of weights "
                          f"a step of {batch} at {bandwidth / 1e9:.1f} GB/s (a torch sum) | {bound:.0f} | {ours / bound:.2f} |",
                          flush=True)
                    print(f"| prefill, GPT-2 {layers} x {width}, V {vocab}, batch {batch}, 128 tokens, {short} (tokens/s) | "
                          f"{med['ours prefill']:.0f} | transformers SDPA, the last token's logits | {med['sdpa prefill']:.0f} | "
                          f"{med['ours prefill'] / med['sdpa prefill']:.2f} |", flush=True)
    if "example" in rows:
        med, diff = example_row(args.rounds)
        close = diff <= 1e-5  # float32 rounding of two orders of the same sums (and the 1e-8 Z term)
        print(f"# twin check, example: attention outputs of ours and the SDPA twin differ by {diff:.1e} of "
              f"the largest: {'ok' if close else 'MISMATCH'}", flush=True)
        if not close:
            MISMATCHES.append("example")
        what = "example nanoGPT + spanformer.nn 4 x H 256 L 512 M 128 B 16, train step"
        for mine in ("ours eager", "ours compiled"):
            for peer in ("eager", "compiled"):
                print(f"| {what}, {mine} | {med[mine]:.0f} | SDPA + log m, {peer} | {med[peer]:.0f} | "
                      f"{med[peer] / med[mine]:.2f} |", flush=True)
    if MISMATCHES:
        sys.exit(f"peers: the twins of these rows are not our models (the '# twin check' lines): {', '.join(MISMATCHES)}")


if __name__ == "__main__":
    main()
