"""torch.ops.spanformer.adaptive_span_attention from Python, held to a PyTorch composition of the
reference's formula written here (independently of the C++ code), in double precision.

    /usr/bin/python3 tests/python/test_torch_op.py            (finds build/libspanformer_torch_ops.so)

1. values and the gradients of q, k, v, key_pe and span_ratio, for spans that cover the whole window,
   part of it and almost none of it (so the kernel skips keys), against the composition: 1e-10;
2. torch.autograd.gradcheck of the operator itself (finite differences);
3. training with dropout: the operator and its registered reference composition agree (same seed);
4. a small nn.Module using the operator trains for 20 Adam steps exactly as the same module built on the
   composition does (losses within 1e-9 at every step), and its loss falls.
Tolerances: the operator computes the same sums in another order (per-head windows, a different
softmax normalisation), so double-precision results differ by rounding only (~1e-15 relative); 1e-10
leaves room for accumulation over a few hundred terms and would still catch any formula error.
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import spanformer  # noqa: E402

op = torch.ops.spanformer.adaptive_span_attention
op_reference = torch.ops.spanformer.adaptive_span_attention_reference


def composition(q, k, v, key_pe, span_ratio, L, R):
    """The reference's adaptive-span attention, spelled out: query i sees keys i .. i+W-1 (distance W-c
    for column c), score = q.k + q.key_pe[:, L-W+c], softmax over the window, soft mask
    clamp((z - (d-1)) / R + 1, 0, 1) with z = span_ratio * L, renormalised with + 1e-8."""
    B, K, M, D = q.shape
    W = k.shape[2] - M
    idx = torch.arange(M).view(M, 1) + torch.arange(W).view(1, W)                # (M, W) key row of (i, c)
    kk = k[:, :, idx]                                                              # (B, K, M, W, D)
    vv = v[:, :, idx]
    scores = (q.unsqueeze(3) * kk).sum(-1) + q @ key_pe[:, L - W:]                 # (B, K, M, W)
    p = torch.softmax(scores / math.sqrt(D), dim=-1)
    d = (W - torch.arange(W)).to(q.dtype)                                          # distance of column c
    m = ((span_ratio * L).view(K, 1, 1) - (d - 1)) / R + 1                         # (K, 1, W)
    a = p * m.clamp(0, 1)
    a = a / (a.sum(-1, keepdim=True) + 1e-8)
    return (a.unsqueeze(-1) * vv).sum(3)                                           # (B, K, M, D)


def inputs(seed, B=2, K=3, M=8, W=24, D=8, L=32, ratios=(1.0, 0.4, 0.03)):
    g = torch.Generator().manual_seed(seed)
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    span = torch.tensor(ratios, dtype=torch.float64).requires_grad_()
    return t(B, K, M, D), t(B, K, W + M, D), t(B, K, W + M, D), t(D, L), span


def check_values_and_gradients():
    L, R = 32, 4.0
    for seed in range(3):
        q, k, v, key_pe, span = inputs(seed)
        ours = op(q, k, v, key_pe, span, L, R)
        theirs = composition(q, k, v, key_pe, span, L, R)
        assert (ours - theirs).abs().max() < 1e-10, (ours - theirs).abs().max()
        go = torch.randn_like(ours)
        g1 = torch.autograd.grad(ours, (q, k, v, key_pe, span), go)
        g2 = torch.autograd.grad(theirs, (q, k, v, key_pe, span), go)
        for name, a, b in zip(("q", "k", "v", "key_pe", "span_ratio"), g1, g2):
            err = (a - b).abs().max().item()
            assert err < 1e-10 * max(1.0, b.abs().max().item()), (name, err)
    print("values and gradients: 3 cases, 5 gradients each, within 1e-10 of the composition")


def check_gradcheck():
    q, k, v, key_pe, span = inputs(7, B=1, K=2, M=4, W=6, D=4, L=8, ratios=(0.9, 0.35))
    f = lambda *x: op(*x, 8, 2.0)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, key_pe, span), eps=1e-6, atol=1e-7)
    print("gradcheck: passed")


def check_dropout():
    q, k, v, key_pe, span = inputs(3)
    a = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True, 1234)
    b = op_reference(q, k, v, key_pe, span, 32, 4.0, 0.3, True, 1234)
    assert (a - b).abs().max() < 1e-10
    c = op(q, k, v, key_pe, span, 32, 4.0, 0.3, True, 99)
    assert (a - c).abs().max() > 1e-3, "another seed must give another dropout mask"
    print("dropout: the operator equals its reference composition for one seed, differs for another")


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


def check_training():
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
    print(f"training: 20 Adam steps, operator vs composition losses within {worst:.1e}; "
          f"loss {losses[0][0]:.4f} -> {losses[0][-1]:.4f}")


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


def check_flash():
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
    print(f"flash: values and gradients within {worst:.1e} of the composition; dropout equals its reference")


if __name__ == "__main__":
    check_values_and_gradients()
    check_flash()
    check_gradcheck()
    check_dropout()
    check_training()
    print("torch op: passed")
