"""torch.ops.spanformer.adaptive_span_attention and flash_attention from Python, held to PyTorch
compositions of the reference formulas written here (independently of the C++ code), in double
precision; and the operators' torch.library registration: fake kernels, autograd and torch.compile.

    .venv/bin/python -m pytest tests/python/test_ops.py      (conftest.py says which build it tests)

1. values and the gradients of q, k, v, key_pe and span_ratio, for spans that cover the whole window,
   part of it and almost none of it (so the kernel skips keys), and whole-token spans (the soft mask sits
   exactly on 0 and 1: LibTorch 1.x's clamp gradient, which spanformer keeps on every LibTorch), against
   the composition: 1e-10;
2. torch.autograd.gradcheck of the operator itself (finite differences);
3. training with dropout: the operator and its registered reference composition agree (same seed), and
   seed -1 draws from torch's generator (torch.manual_seed repeats the mask);
4. a small nn.Module using the operator trains for 20 Adam steps exactly as the same module built on the
   composition does (losses within 1e-9 at every step), and its loss falls;
5. flash attention: dense, banded, with a KV cache, values and gradients; dropout equals its reference;
6. torch.library.opcheck (schema, fake tensors, autograd registration, AOT dispatch) of every operator,
   and torch.compile(fullgraph=True) of a module calling both: no graph break, the same values and
   gradients as eager, with and without dropout.
Tolerances: the operator computes the same sums in another order (per-head windows, a different
softmax normalisation), so double-precision results differ by rounding only (~1e-15 relative); 1e-10
leaves room for accumulation over a few hundred terms and would still catch any formula error.
"""
import ast
import math
import os

import pytest
import torch

import spanformer

op = torch.ops.spanformer.adaptive_span_attention
op_reference = torch.ops.spanformer.adaptive_span_attention_reference


def composition(q, k, v, key_pe, span_ratio, L, R):
    """The reference's adaptive-span attention, spelled out: query i sees keys i .. i+W-1 (distance W-c
    for column c), score = q.k + q.key_pe[:, L-W+c], softmax over the window, soft mask
    clamp((z - (d-1)) / R + 1, 0, 1) with z = span_ratio * L, renormalised with + 1e-8. The clamp passes
    its gradient on the closed interval [0, 1] (LibTorch 1.x's rule; 2.x passes none at the ends)."""
    B, K, M, D = q.shape
    W = k.shape[2] - M
    idx = torch.arange(M).view(M, 1) + torch.arange(W).view(1, W)                # (M, W) key row of (i, c)
    kk = k[:, :, idx]                                                              # (B, K, M, W, D)
    vv = v[:, :, idx]
    scores = (q.unsqueeze(3) * kk).sum(-1) + q @ key_pe[:, L - W:]                 # (B, K, M, W)
    p = torch.softmax(scores / math.sqrt(D), dim=-1)
    d = (W - torch.arange(W)).to(q.dtype)                                          # distance of column c
    x = ((span_ratio * L).view(K, 1, 1) - (d - 1)) / R + 1                         # (K, 1, W)
    m = torch.where((x >= 0) & (x <= 1), x, x.clamp(0, 1).detach())  # gradient 1 on [0, 1], ends included
    a = p * m
    a = a / (a.sum(-1, keepdim=True) + 1e-8)
    return (a.unsqueeze(-1) * vv).sum(3)                                           # (B, K, M, D)


def inputs(seed, B=2, K=3, M=8, W=24, D=8, L=32, ratios=(1.0, 0.4, 0.03)):
    g = torch.Generator().manual_seed(seed)
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    span = torch.tensor(ratios, dtype=torch.float64).requires_grad_()
    return t(B, K, M, D), t(B, K, W + M, D), t(B, K, W + M, D), t(D, L), span


@pytest.mark.parametrize("seed,ratios", [(0, (1.0, 0.4, 0.03)), (1, (1.0, 0.4, 0.03)), (2, (1.0, 0.4, 0.03)),
                                         (3, (0.5, 0.25, 0.0))])
def test_values_and_gradients(seed, ratios):
    L, R = 32, 4.0
    q, k, v, key_pe, span = inputs(seed, ratios=ratios)
    ours = op(q, k, v, key_pe, span, L, R)
    theirs = composition(q, k, v, key_pe, span, L, R)
    assert (ours - theirs).abs().max() < 1e-10, (ours - theirs).abs().max()
    go = torch.randn_like(ours)
    g1 = torch.autograd.grad(ours, (q, k, v, key_pe, span), go)
    g2 = torch.autograd.grad(theirs, (q, k, v, key_pe, span), go)
    for name, a, b in zip(("q", "k", "v", "key_pe", "span_ratio"), g1, g2):
        err = (a - b).abs().max().item()
        assert err < 1e-10 * max(1.0, b.abs().max().item()), (name, err)


def test_gradcheck():
    q, k, v, key_pe, span = inputs(7, B=1, K=2, M=4, W=6, D=4, L=8, ratios=(0.9, 0.35))
    f = lambda *x: op(*x, 8, 2.0)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, key_pe, span), eps=1e-6, atol=1e-7)


def test_dropout():
    q, k, v, key_pe, span = inputs(3)
    a = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True, 1234)
    b = op_reference(q, k, v, key_pe, span, 32, 4.0, 0.3, True, 1234)
    assert (a - b).abs().max() < 1e-10
    c = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True, 99)
    assert (a - c).abs().max() > 1e-3, "another seed must give another dropout mask"
    # seed -1: drawn from torch's default generator when the operator runs
    torch.manual_seed(8)
    d = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True)
    torch.manual_seed(8)
    e = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True)
    f = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True)
    assert torch.equal(d, e) and (e - f).abs().max() > 1e-3


class Layer(torch.nn.Module):
    """One attention layer with learned spans over a carried context, on either implementation."""

    def __init__(self, use_op, D=8, K=2, L=16):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.K, self.D, self.L, self.use_op = K, D, L, use_op
        self.qkv = torch.nn.Parameter(torch.randn(3, K * D, K * D, generator=g, dtype=torch.float64) * 0.3)
        self.key_pe = torch.nn.Parameter(torch.randn(D, L, generator=g, dtype=torch.float64) * 0.3)
        self.span = torch.nn.Parameter(torch.tensor([0.5, 0.2], dtype=torch.float64))

    def forward(self, x, context):  # x (B, M, K*D), context (B, W, K*D)
        h = torch.cat([context, x], 1)
        B, T, _ = h.shape
        split = lambda y: y.view(B, -1, self.K, self.D).transpose(1, 2)  # noqa: E731
        q, k, v = split(x @ self.qkv[0]), split(h @ self.qkv[1]), split(h @ self.qkv[2])
        f = op if self.use_op else (lambda *a: composition(*a[:5], a[5], a[6]))
        out = f(q, k, v, self.key_pe, self.span, self.L, 4.0)
        return out.transpose(1, 2).reshape(B, -1, self.K * self.D)


def test_training():
    g = torch.Generator().manual_seed(5)
    data = torch.randn(4, 40, 16, generator=g, dtype=torch.float64)
    target = torch.roll(data, 3, dims=1)  # needs to look 3 tokens back
    losses = []
    for use_op in (True, False):
        layer = Layer(use_op)
        opt = torch.optim.Adam(layer.parameters(), lr=0.01)
        run = []
        for step in range(20):
            M, W = 8, 12
            i = 12 + (step % 3) * 8
            loss = ((layer(data[:, i:i + M], data[:, i - W:i]) - target[:, i:i + M]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                layer.span.clamp_(0, 1)
            run.append(loss.item())
        losses.append(run)
    worst = max(abs(a - b) for a, b in zip(*losses))
    assert worst < 1e-9, worst
    assert losses[0][-1] < losses[0][0], losses[0]


def flash_composition(q, k, v, band):
    """Causal softmax attention spelled out: query i sits at key position C - N + i and reads the keys j
    with position - band < j <= position (band 0: every earlier key)."""
    N, C, D = q.shape[2], k.shape[2], q.shape[3]
    band = C if band == 0 else band
    pos = torch.arange(C - N, C).view(N, 1)
    j = torch.arange(C).view(1, C)
    allowed = (j <= pos) & (pos - j < band)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def test_flash():
    """torch.ops.spanformer.flash_attention: dense and a band of 5, with and without a KV cache, values
    and gradients against the composition in double (1e-10), and dropout equal to its reference."""
    worst = 0.0
    for N, C, band in ((40, 40, 0), (7, 30, 0), (33, 50, 5)):
        g = torch.Generator().manual_seed(N + C)
        q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.double, generator=g, requires_grad=True) for n in (N, C, C))
        out = torch.ops.spanformer.flash_attention(q, k, v, band)
        ref = flash_composition(q, k, v, band)
        w = torch.randn(out.shape, dtype=torch.double, generator=g)
        grads = torch.autograd.grad((out * w).sum(), (q, k, v))
        grads_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
        worst = max([worst, (out - ref).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(grads, grads_ref)])
    assert worst < 1e-10, worst
    q = torch.randn(1, 2, 20, 8, dtype=torch.double)
    a = torch.ops.spanformer.flash_attention(q, q, q, 0, 0.3, True, 9)
    b = torch.ops.spanformer.flash_attention_reference(q, q, q, 0, 0.3, True, 9)
    assert (a - b).abs().max().item() < 1e-12
    assert spanformer.flash_attention(q, q, q).shape == q.shape



def small_inputs(dtype=torch.float64):
    q, k, v, key_pe, span = inputs(11, B=2, K=3, M=8, W=24, D=8, L=32)
    return [t.detach().to(dtype).requires_grad_() for t in (q, k, v, key_pe, span)]


OPCHECK_CASES = {
    "adaptive_span_attention": lambda t: (*t, 32, 4.0),
    "adaptive_span_attention_reference": lambda t: (*t, 32, 4.0),
    # with soft-capping and a sink logit per head (3 heads), which get gradients of their own, and a padded
    # batch (row 0 left-padded by 2, row 1 right-padded after 5 keys)
    "flash_attention": lambda t: (t[0], t[0], t[0], 5, 0.0, False, -1, 256, True, 3.0, SINKS.clone().requires_grad_(),
                                  KEY_RANGES),
    "flash_attention_reference": lambda t: (t[0], t[0], t[0], 5, 0.0, False, -1, 3.0, SINKS.clone().requires_grad_(),
                                            KEY_RANGES),
    "_adaptive_span_attention_forward": lambda t: (*[x.detach() for x in t], 32, 4.0, 0.0, False, 3, [], True, "cpu"),
    "_flash_attention_forward": lambda t: (*[t[0].detach()] * 3, 8, 0.0, False, 3, 256, False, 3.0, SINKS, KEY_RANGES),
}
SINKS = torch.tensor([0.5, -1.0, 2.0])
KEY_RANGES = torch.tensor([[2, 8], [0, 5]])


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs PyTorch 2.4")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(OPCHECK_CASES))
def test_opcheck(name, dtype):
    """Schema, fake (Meta) kernels against the real ones (the 16-bit dtypes' float32 logsumexp and kept
    probabilities too), autograd registration, AOT dispatch."""
    args = OPCHECK_CASES[name](small_inputs(dtype))
    torch.library.opcheck(getattr(torch.ops.spanformer, name).default, args)


def test_the_span_halves_run_the_row_they_name():
    """The private pair takes the row's name: the cpu row's halves give the public op's output, and a row
    without halves (the reference) or not in the build is a one-line error."""
    t = [x.detach() for x in small_inputs()]
    out, saved, _ = torch.ops.spanformer._adaptive_span_attention_forward(*t, 32, 4.0, 0.0, False, 3, [], True, "cpu")
    assert torch.equal(out, torch.ops.spanformer.adaptive_span_attention(*t, 32, 4.0))
    assert saved.shape == (3, 2, 8, 24)  # the cpu row keeps p (K, B, M, W)
    for row in ("reference", "tpu"):
        with pytest.raises(RuntimeError, match=f"no kernel row '{row}'"):
            torch.ops.spanformer._adaptive_span_attention_forward(*t, 32, 4.0, 0.0, False, 3, [], True, row)



def test_the_private_halves_check_what_they_are_given():
    """Called directly, the private operators refuse in one line what the public ones would: keys shorter
    than the queries, a band outside 1 .. C, a backward given tensors of other shapes (none reaches a
    kernel that would read past them)."""
    t = [x.detach() for x in small_inputs()]
    q, k = t[0], t[1]
    ops = torch.ops.spanformer
    with pytest.raises(RuntimeError, match="window .* outside"):
        ops._adaptive_span_attention_forward(q, q, q, t[3], t[4], 32, 4.0, 0.0, False, 3, [], True, "cpu")
    out, saved, seed = ops._adaptive_span_attention_forward(*t, 32, 4.0, 0.0, False, 3, [], True, "cpu")
    with pytest.raises(RuntimeError, match="saved the cpu row's 3x2x8x24"):
        ops._adaptive_span_attention_backward(out, *t, out, saved[:, :1], seed, 32, 4.0, 0.0, False, [], "cpu")
    g = ops._adaptive_span_attention_backward(out, *t, out, saved, seed, 32, 4.0, 0.0, False, [], "cpu")
    assert [x.shape for x in g] == [x.shape for x in t]
    with pytest.raises(RuntimeError, match="C >= N >= 1"):
        ops._flash_attention_forward(k, q, q, 8, 0.0, False, 3, 256, False, 0.0, None, None)
    for band in (0, 9):
        with pytest.raises(RuntimeError, match=r"band must be in \[1, C = 8\]"):
            ops._flash_attention_forward(q, q, q, band, 0.0, False, 3, 256, False, 0.0, None, None)
    out, lse, seed = ops._flash_attention_forward(q, q, q, 8, 0.0, False, 3, 256, False, 0.0, None, None)
    with pytest.raises(RuntimeError, match="lse \\(B, K, N\\)"):
        ops._flash_attention_backward(out, q, q, q, out, lse[:, :, :2], seed, 8, 0.0, False, 256, False, 0.0, None, None)
    with pytest.raises(RuntimeError, match=r"sinks must be one floating-point logit per head, \(3\)"):
        ops._flash_attention_forward(q, q, q, 8, 0.0, False, 3, 256, False, 0.0, torch.zeros(2), None)
    for ranges, said in ((torch.tensor([[0, 9], [0, 8]]), r"key_ranges row 0 is \[0, 9\): expected 0 <= first <= end <= C = 8"),
                         (torch.tensor([[0, 8], [5, 4]]), r"key_ranges row 1 is \[5, 4\)"),
                         (torch.tensor([[0, 8]]), r"key_ranges must be \(B, 2\) = \(2, 2\) integers"),
                         (torch.zeros(2, 2), r"key_ranges must be .* integers")):
        with pytest.raises(RuntimeError, match=said):
            ops._flash_attention_forward(q, q, q, 8, 0.0, False, 3, 256, False, 0.0, None, ranges)


_CACHE_PROBE = """
import torch, spanformer
from torch._dynamo.utils import counters
q = torch.randn(1, 2, 16, 8, requires_grad=True)
f = torch.compile(lambda q: spanformer.adaptive_span_attention(q, torch.cat([q, q], 2), torch.cat([q, q], 2),
                  torch.ones(8, 16), torch.full((2,), 0.5), 16, 4.0).square().sum(), fullgraph=True)
f(q).backward()
hits = sum(v for k, v in list(counters["inductor"].items()) + list(counters["aot_autograd"].items()) if k.endswith("cache_hit"))
print("hits", hits)
"""


@pytest.mark.skipif(not hasattr(getattr(torch, "compiler", None), "config")
                    or not hasattr(torch.compiler.config, "cache_key_tag"),
                    reason="needs PyTorch 2 with torch.compiler.config.cache_key_tag")
def test_compile_caches_do_not_outlive_the_library(tmp_path):
    """A graph torch.compile cached with one build of the library is not replayed with another (the
    traced program names the public operators only; the private ones it expands into may differ): the
    same library compiled again hits the cache; a different library file (here a copy with one byte
    appended, which loads the same) misses it. A user's own cache tag is kept in front of ours."""
    import shutil
    import subprocess
    import sys
    lib = spanformer._library_path()
    other = tmp_path / "libspanformer_torch_ops.so"
    shutil.copy(lib, other)
    with open(other, "ab") as f:
        f.write(b"\0")

    def hits(library, tag=""):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "SPANFORMER_TORCH_OPS": str(library),
               "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1", "TORCH_COMPILE_CACHE_KEY_TAG": tag,
               "PYTHONPATH": os.path.dirname(os.path.dirname(spanformer.__file__))}
        run = subprocess.run([sys.executable, "-c", _CACHE_PROBE], capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        return int(run.stdout.split()[-1])

    assert hits(lib) == 0
    assert hits(lib) > 0
    assert hits(other) == 0
    assert torch.compiler.config.cache_key_tag.startswith("spanformer-")
    code = "import spanformer, torch; print(torch.compiler.config.cache_key_tag)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_COMPILE_CACHE_KEY_TAG": "mine",
                              "PYTHONPATH": os.path.dirname(os.path.dirname(spanformer.__file__))})
    assert run.stdout.strip() == "mine+" + torch.compiler.config.cache_key_tag, run.stdout + run.stderr[-500:]


class TwoOps(torch.nn.Module):
    """A PyTorch module calling both operators, as a user's model would."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.dropout = dropout

    def forward(self, q, k, v, key_pe, span):
        a = torch.ops.spanformer.adaptive_span_attention(q, k, v, key_pe, span, 32, 4.0, self.dropout, self.training)
        b = torch.ops.spanformer.flash_attention(a, q, q, 0, self.dropout, self.training)
        return (a * b).sum() + b.square().mean()


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs PyTorch 2")
def test_compiled_cpu_kernels_are_vectorised_after_import(tmp_path):
    """Where Python's LIBDIR holds another LibTorch (Debian's libtorch-dev beside PyPI's torch), Inductor
    links its CPU kernels against that one unless `import spanformer` puts this torch's libraries first:
    its vector-ISA probe then fails and torch.compile makes scalar kernels (or, with a probe cached by a
    process that linked right, kernels that do not load). In a fresh process with an empty Inductor
    cache: on a CPU with AVX2 the probe finds a vector ISA after `import spanformer`."""
    import subprocess
    import sys
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    code = ("import spanformer\nfrom torch._inductor import cpu_vec_isa\n"
            "print([str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                              "PYTHONPATH": os.path.dirname(os.path.dirname(spanformer.__file__))})
    assert run.returncode == 0, run.stderr[-2000:]
    found = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    if " avx2 " in flags.replace("\n", " "):
        assert found, "torch.compile would make scalar CPU kernels: " + run.stdout


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs PyTorch 2")
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_compile_fullgraph(dropout):
    """torch.compile(fullgraph=True) raises on a graph break; the compiled module computes what eager does,
    values and gradients, with the same dropout masks for the same torch.manual_seed."""
    torch._dynamo.reset()
    eager = TwoOps(dropout)
    compiled = torch.compile(TwoOps(dropout), fullgraph=True, backend="aot_eager")
    x = small_inputs()
    torch.manual_seed(4)
    want = eager(*x)
    want_grads = torch.autograd.grad(want, x)
    torch.manual_seed(4)
    got = compiled(*x)
    got_grads = torch.autograd.grad(got, x)
    assert abs(got.item() - want.item()) < 1e-12 * max(1.0, abs(want.item()))
    for a, b in zip(got_grads, want_grads):
        assert (a - b).abs().max().item() < 1e-12
    if dropout > 0:  # a fresh mask on the next call: the seed is drawn when the op runs, not when traced
        assert abs(compiled(*x).item() - got.item()) > 1e-6


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs PyTorch 2")
def test_compile_inductor():
    """The default backend (Inductor generates C++ around the operators) in float32."""
    torch._dynamo.reset()
    x = small_inputs(torch.float32)
    want = TwoOps()(*x)
    got = torch.compile(TwoOps(), fullgraph=True)(*x)
    assert abs(got.item() - want.item()) < 1e-4 * max(1.0, abs(want.item()))
    got_grads = torch.autograd.grad(got, x)
    want_grads = torch.autograd.grad(want, x)
    for a, b in zip(got_grads, want_grads):
        assert (a - b).abs().max().item() < 1e-4 * max(1.0, b.abs().max().item())


def test_cpu_half_products_switch_and_refuse_unknown_modes():
    """spanformer.cpu_half_products sets what the CPU kernels do with bf16 inputs and says it; `auto`
    comes back to where the process started (native exactly where the CPU has bf16 hardware, AMX or
    AVX512-BF16, and the LibTorch has 16-bit tile products); a wrong mode is a ValueError naming the
    modes, and changes nothing."""
    start = spanformer.cpu_half_products()
    flags = open("/proc/cpuinfo").read().split()
    hardware = "amx_bf16" in flags or "avx512_bf16" in flags
    if "SPANFORMER_CPU_HALF_PRODUCTS" not in os.environ:
        assert start == ("native" if hardware and int(torch.__version__.split(".")[0]) >= 2 else "widened")
    try:
        if int(torch.__version__.split(".")[0]) < 2:  # LibTorch 1.13 has no 16-bit brgemm: refused by name
            with pytest.raises(RuntimeError, match="no 16-bit brgemm"):
                spanformer.cpu_half_products("native")
        else:
            assert spanformer.cpu_half_products("native") == "native"
        with pytest.raises(ValueError, match="expected 'auto', 'widened' or 'native'"):
            spanformer.cpu_half_products("fast")
        assert spanformer.cpu_half_products("widened") == "widened"
        assert spanformer.cpu_half_products() == "widened"
    finally:
        assert spanformer.cpu_half_products("auto") == start


def test_cpu_autocast_runs_the_ops_in_bf16_exactly_where_products_are_native():
    """Under torch.autocast("cpu", bfloat16) the flash and adaptive-span ops compute in bf16 where the
    kernels take bf16 operands (cpu_half_products() == "native") and in float32 where they would widen;
    either way the output and the gradients of the float32 inputs stay within bf16 rounding of the
    float32 op (relative 2^-5: a few bf16 ulps of the operands through two products)."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 70, 32, requires_grad=True) for _ in range(3))
    kk, vv = (torch.randn(1, 2, 70 + 48, 32, requires_grad=True) for _ in range(2))
    pe = torch.randn(32, 48, requires_grad=True)
    ratio = torch.tensor([0.3, 0.9], requires_grad=True)
    ops = {
        "flash": (lambda: spanformer.flash_attention(q, k, v), (q, k, v)),
        "adaptive span": (lambda: spanformer.adaptive_span_attention(q, kk, vv, pe, ratio, attn_span=48, ramp=8),
                          (q, kk, vv, pe, ratio)),
    }
    for mode in ("widened", "native") if int(torch.__version__.split(".")[0]) >= 2 else ("widened",):
        start = spanformer.cpu_half_products()
        try:
            spanformer.cpu_half_products(mode)
            for name, (op, inputs) in ops.items():
                want = op()
                want_grads = torch.autograd.grad(want.square().sum(), inputs)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    got = op()
                assert got.dtype == (torch.bfloat16 if mode == "native" else torch.float32), (name, mode)
                got_grads = torch.autograd.grad(got.float().square().sum(), inputs)
                assert (got.float() - want).abs().max() < 2 ** -5 * want.abs().max(), (name, mode)
                for g, w in zip(got_grads, want_grads):
                    assert g.dtype == torch.float32
                    assert (g - w).abs().max() < 2 ** -5 * w.abs().max(), (name, mode)
        finally:
            spanformer.cpu_half_products(start if start == "widened" else "auto")


def test_integer_and_mixed_inputs_are_one_line_errors_naming_the_dtypes():
    """Integer tensors and tensors of two dtypes: one line each, naming what was given (not ATen's
    "expected scalar type Float but found Long" from deep inside a kernel, or "not implemented for")."""
    q, k, pe = torch.ones(1, 1, 4, 8), torch.ones(1, 1, 12, 8), torch.ones(8, 8)
    with pytest.raises(RuntimeError, match=r"^flash attention: q, k and v must be floating point .*got Long$"):
        spanformer.flash_attention(q.long(), q.long(), q.long())
    with pytest.raises(RuntimeError, match=r"^flash attention: q, k and v must share dtype and device \(got Float on cpu, Double"):
        spanformer.flash_attention(q, q.double(), q)
    with pytest.raises(RuntimeError, match=r"^adaptive_span_attention: the inputs must be floating point .*got Long"):
        spanformer.adaptive_span_attention(q.long(), k.long(), k.long(), pe.long(), torch.zeros(1).long(), 8)
    with pytest.raises(RuntimeError, match=r"^adaptive_span_attention: all inputs must share dtype and device \(q is Float"):
        spanformer.adaptive_span_attention(q, k, k, pe.long(), torch.zeros(1), 8)


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="PyTorch 1.13 has no autograd fallback for the Meta key (needs PyTorch 2)")
def test_meta_tensors_give_the_output_shapes():
    """Both operators on meta tensors (shape inference, torch.compile's fake tensors without their mode):
    the output's shape and dtype, no data, no error (autocast has no state for the meta device)."""
    q = torch.empty(1, 2, 8, 16, device="meta")
    out = spanformer.flash_attention(q, q, q)
    assert out.device.type == "meta" and out.shape == (1, 2, 8, 16) and out.dtype == torch.float32
    k, pe, r = torch.empty(1, 2, 12, 16, device="meta"), torch.empty(16, 4, device="meta"), torch.empty(2, device="meta")
    out = spanformer.adaptive_span_attention(q, k, k, pe, r, 4)
    assert out.device.type == "meta" and out.shape == (1, 2, 8, 16)


def test_values_of_another_head_width_are_named_as_such():
    """v with another head width than q and k (multi-head latent attention's split widths): one line
    naming the widths, not a message about lengths."""
    q, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 8)
    with pytest.raises(RuntimeError, match=r"^flash attention: v's head width 8 differs from q's and k's 16"):
        spanformer.flash_attention(q, q, v)
    k, pe, r = torch.randn(1, 2, 12, 16), torch.randn(16, 4), torch.zeros(2)
    with pytest.raises(RuntimeError, match=r"^adaptive_span_attention: v's head width 8 differs from k's 16"):
        spanformer.adaptive_span_attention(q, k, torch.randn(1, 2, 12, 8), pe, r, 4)


def test_python_arguments_out_of_range_or_type_are_one_line_errors():
    """Integers beyond 64 bits and arguments of the wrong type: one exception with a one-line message
    naming the argument (not TorchScript's multi-line "Expected a value of type ..." listing)."""
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"^flash_attention: band must fit in 64 bits \(got 1180591620717411303424\)$"):
        spanformer.flash_attention(q, q, q, band=2 ** 70)
    with pytest.raises(ValueError, match=r"^flash_attention: seed must fit in 64 bits"):
        spanformer.flash_attention(q, q, q, seed=-2 ** 64)
    with pytest.raises(TypeError, match=r"^flash_attention: band must be int \(got float 2.5\)$"):
        spanformer.flash_attention(q, q, q, band=2.5)
    k, pe = torch.randn(1, 1, 12, 8), torch.randn(8, 8)
    with pytest.raises(ValueError, match=r"^adaptive_span_attention: attn_span must fit in 64 bits"):
        spanformer.adaptive_span_attention(q, k, k, pe, torch.zeros(1), 2 ** 64)
    with pytest.raises(TypeError, match=r"^tokenize_13a: line must be str \(got NoneType None\)$"):
        spanformer.tokenize_13a(None)
