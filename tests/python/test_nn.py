"""spanformer.nn: adaptive span as PyTorch modules. Held to the reference's formulas written out here as
loops (double precision), to the reference-trained fixture (../shared/reference/adaptive-span-small4:
its spans, trim lengths, cache sizes and its own log-probabilities, through a model built from these
modules and loaded with the tensors of our checkpoint), and traced by torch.compile(fullgraph=True)."""
import json
import math
import os

import pytest
import torch

import spanformer
import spanformer.nn as snn

HERE = os.path.dirname(os.path.abspath(__file__))


def loop_mask(z, d, R):
    return min(1.0, max(0.0, (R + z - (d - 1)) / R))


def test_adaptive_span_mask_loss_and_sizes_are_the_reference_formulas():
    """The mask at every distance, the renormalised attention, the loss, the clamp and the host sizes
    against the formulas computed one number at a time."""
    L, K, R = 300, 3, 32
    span = snn.AdaptiveSpan(L, K, ramp=R, loss_coeff=2e-6).double()
    with torch.no_grad():
        span.span_ratio.copy_(torch.tensor([0.05, 0.5, 1.2], dtype=torch.float64))  # the last one out of range
    span.clamp_()
    ratios = [0.05, 0.5, 1.0]
    assert span.span_ratio.tolist() == ratios
    W = 200
    mask = span.mask(W)
    for h, r in enumerate(ratios):
        for j in range(W):
            assert mask[h, j].item() == pytest.approx(loop_mask(r * L, W - j, R), abs=1e-15)
    attn = torch.softmax(torch.randn(2, K, 5, W, dtype=torch.float64), -1)
    got = span(attn)
    for h in range(K):
        row = [attn[1, h, 4, j].item() * loop_mask(ratios[h] * L, W - j, R) for j in range(W)]
        total = sum(row) + 1e-8
        assert torch.allclose(got[1, h, 4], torch.tensor([x / total for x in row], dtype=torch.float64), atol=1e-15)
    assert span.loss().item() == pytest.approx(2e-6 * L * sum(ratios) / K, rel=1e-15)
    S = min(L, math.ceil(max(ratios) * L) + R)
    assert span.max_size() == S == L
    assert span.trim_len() == 0 and span.cache_size() == L
    with torch.no_grad():
        span.span_ratio.fill_(0.1)
    span.clamp_()  # z = 30: S = 62, trim 64 floor(238 / 64) = 192, L' 108, cache 172
    assert (span.max_size(), span.trim_len(), span.used_span(), span.cache_size()) == (62, 192, 108, 172)
    assert snn.AdaptiveSpan(L, K, cache=False).cache_size() == L


def reference_attention(h, cache, key_pe, layer):
    """One query, one distance at a time in double precision: the reference's attention with its cache
    left-padded to L' (the op's header has the formula)."""
    B, M, H = h.shape
    K, D, Lp, L, R = layer.nb_heads, H // layer.nb_heads, layer.span.used_span(), layer.span.attn_span, layer.span.ramp
    context = torch.cat([torch.zeros(B, max(0, Lp - cache.shape[1]), H, dtype=h.dtype), cache[:, -Lp:] if Lp else cache[:, :0], h], 1)
    q, k, v = layer.proj_query(h), layer.proj_key(context), layer.proj_val(context)
    out = torch.zeros(B, M, H, dtype=h.dtype)
    for b in range(B):
        for i in range(M):
            for hd in range(K):
                sl = slice(hd * D, hd * D + D)
                s = [(q[b, i, sl] @ (k[b, Lp + i - d, sl] + key_pe[:, L - d])).item() / math.sqrt(D) for d in range(1, Lp + 1)]
                top = max(s)
                e = [math.exp(x - top) for x in s]
                Z = sum(e)
                z = layer.span.span_ratio[hd].item() * L
                a = [e[d - 1] / Z * loop_mask(z, d, R) for d in range(1, Lp + 1)]
                total = sum(a) + 1e-8
                out[b, i, sl] = sum(a[d - 1] / total * v[b, Lp + i - d, sl] for d in range(1, Lp + 1))
    return layer.proj_out(out)


@pytest.mark.parametrize("cache_len", [0, 70, 200])
def test_adaptive_span_attention_is_the_reference_attention(cache_len):
    """Against the loops above in double: an empty cache (zeros before the start), a short one and one
    longer than L'; values to 1e-12, and the spans get a gradient (the soft mask learns)."""
    torch.manual_seed(cache_len)
    layer = snn.AdaptiveSpanAttention(16, 2, attn_span=128, ramp=8, init=0.3).double()
    with torch.no_grad():
        layer.span.span_ratio.copy_(torch.tensor([0.1, 0.3], dtype=torch.float64))
    layer.span.clamp_()  # z 12.8 and 38.4: S = 47, trim 64, L' 64
    assert layer.span.used_span() == 64
    h = torch.randn(2, 5, 16, dtype=torch.float64)
    cache = torch.randn(2, cache_len, 16, dtype=torch.float64)
    key_pe = torch.randn(8, 128, dtype=torch.float64)
    got = layer(h, cache, key_pe)
    with torch.no_grad():
        want = reference_attention(h, cache, key_pe, layer)
    assert torch.allclose(got, want, atol=1e-12, rtol=0), (got - want).abs().max()
    got.square().sum().backward()
    assert layer.span.span_ratio.grad.abs().min() > 0


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs PyTorch 2")
def test_compiled_fullgraph_equals_eager_and_moving_spans_do_not_recompile():
    """torch.compile(fullgraph=True) traces the layer (no host read inside forward): the same output;
    and spans that move after an update (as every step moves them) reuse the graph unless the layer's
    trim length changes, which recompiles once."""
    torch.manual_seed(1)
    layer = snn.AdaptiveSpanAttention(16, 2, attn_span=256, init=0.2)
    h, cache, key_pe = torch.randn(2, 8, 16), torch.randn(2, 256, 16), torch.randn(8, 256)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(h, cache, key_pe), layer(h, cache, key_pe), atol=1e-6, rtol=0)
    with torch.no_grad():
        layer.span.span_ratio.add_(0.01)  # z 51.2 -> 53.8: trim stays 128
    layer.span.clamp_()
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.allclose(compiled(h, cache, key_pe), layer(h, cache, key_pe), atol=1e-6, rtol=0)
    with torch.no_grad():
        layer.span.span_ratio.fill_(0.9)  # z 230: no trim
    layer.span.clamp_()
    assert torch.allclose(compiled(h, cache, key_pe), layer(h, cache, key_pe), atol=1e-6, rtol=0)


def test_the_nanogpt_example_runs_as_a_smoke_test(tmp_path, shared):
    """A smoke test of examples/python/nanogpt_adaptive_span.py at a small size (compiled where PyTorch 2
    compiles, 40 steps on Dickens' first 200 KB): it runs to the end, prints its progress and a finite
    held-out figure, and draws the spans (a PNG with drawn pixels). It does not show that attention
    helps: 40 steps of this model give about 5.5 bits per byte with attention and without (5.48 and 5.51
    measured), so the figure is only held to the range a byte model can show (below 8, a uniform guess).
    That the adaptive-span attention itself computes the right thing is test_nn.py's other tests and
    the operators' (test_ops.py, test_oracles.py)."""
    import subprocess
    import sys
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:200000])
    example = os.path.join(HERE, "..", "..", "examples", "python", "nanogpt_adaptive_span.py")
    out = tmp_path / "spans.png"
    run = subprocess.run([sys.executable, example, "--text", str(text), "--steps", "40", "--layers", "2", "--d-model", "32",
                          "--heads", "2", "--span", "128", "--block", "32", "--batch", "4", "--threads", "1",
                          "--eval-blocks", "4", "--out", str(out)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(spanformer.__file__)),
                              # compiled afresh: a cached kernel would hide one that no longer links
                              "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "step    40 | train" in run.stdout and "tokens/s" in run.stdout
    held = float(run.stdout.split("held-out: ")[1].split()[0])
    assert math.isfinite(held) and 1.0 < held < 8.0, held
    drawn = subprocess.run([sys.executable, os.path.join(HERE, "..", "png_check.py"), str(out), "--min-drawn", "2",
                            "--min-colours", "4"], capture_output=True, text=True)
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr


class Small4(torch.nn.Module):
    """The adaptive-span LM (include/spanformer/models/transformer_seq.h) from spanformer.nn's attention
    and torch.nn, with the C++ model's parameter names."""

    def __init__(self, V, H, K, I, L, layers):
        super().__init__()
        self.in_emb, self.out_emb = torch.nn.Embedding(V, H), torch.nn.Linear(H, V)
        self.key_pe = torch.nn.Parameter(torch.zeros(H // K, L))
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict({
            "attn": snn.AdaptiveSpanAttention(H, K, L), "norm1": torch.nn.LayerNorm(H), "fc1": torch.nn.Linear(H, I),
            "fc2": torch.nn.Linear(I, H), "norm2": torch.nn.LayerNorm(H)}) for _ in range(layers))

    def forward(self, x, caches):
        h, new = self.in_emb(x), []
        for layer, cache in zip(self.layers, caches):
            new.append(torch.cat([cache, h], 1)[:, -layer["attn"].cache_size():])
            h = layer["norm1"](h + layer["attn"](h, cache, self.key_pe))
            h = layer["norm2"](h + layer["fc2"](torch.relu(layer["fc1"](h))))
        return torch.log_softmax(self.out_emb(h), -1), new


def test_modules_with_our_checkpoints_tensors_give_the_references_log_probabilities(cli, shared, tmp_path):
    """The reference-trained small4 model imported to our checkpoint; its tensors loaded by name into a
    model built from spanformer.nn: each layer's spans, trim length and cache size are the reference's
    (expected.json), and two blocks of valid ids from zero caches give the reference's own
    log-probabilities (fixed_logprobs.pt) within 1e-4, the C++ model's tolerance for this fixture
    (float32, other summation orders; log-probabilities down to -16)."""
    ref = os.path.join(shared, "reference", "adaptive-span-small4")
    config = os.path.join(HERE, "..", "data", "adaptive_span_small4.json")
    ckpt = str(tmp_path / "small4.pt")
    cli("import", "adaptive-span", os.path.join(ref, "model.pt"), "--config", config,
        "--vocab", os.path.join(ref, "vocab.txt"), "--out", ckpt)
    tensors = spanformer.load(ckpt).state_dict()
    m = json.load(open(config))["model"]
    model = Small4(98, m["hidden_size"], m["nb_heads"], m["inner_hidden_size"], m["attn_span"], m["nb_layers"])
    missing, unexpected = model.load_state_dict({k: v for k, v in tensors.items() if not k.endswith("_host")}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    expected = json.load(open(os.path.join(ref, "expected.json")))["expected"]
    for l, layer in enumerate(model.layers):
        assert layer["attn"].span.spans() == pytest.approx(expected["spans_z"][l], abs=1e-3)
        assert layer["attn"].span.trim_len() == expected["layer_trim_len"][l]
        assert layer["attn"].cache_size() == expected["layer_cache_size"][l]
    want = torch.load(os.path.join(ref, "fixed_logprobs.pt"))  # (1, T, V)
    T = want.shape[1]
    ids = torch.tensor([list(open(os.path.join(shared, "reference", "adaptive-span-tiny", "valid.ids.u8"), "rb").read()[:T])])
    model.eval()
    caches = [torch.zeros(1, 0, m["hidden_size"]) for _ in model.layers]
    with torch.no_grad():
        first, caches = model(ids[:, : T // 2], caches)
        second, _ = model(ids[:, T // 2:], caches)
    got = torch.cat([first, second], 1)
    assert (got - want).abs().max().item() < 1e-4, (got - want).abs().max()


def test_plot_spans_refuses_nan_and_negative_spans(tmp_path):
    """A span is a number of tokens >= 0: NaN, infinite and negative ones are refused by name, in Python
    and by the operator itself, before anything is drawn."""
    for bad in (float("nan"), -3.0, float("inf")):
        with pytest.raises(ValueError, match=r"^plot_spans: a span is a number of tokens >= 0 \(layer 1 head 0: "):
            spanformer.plot_spans([[1.0, 2.0], [bad, 4.0]], tmp_path / "s.png", 64)
        with pytest.raises(RuntimeError, match=r"^plot_spans: a span is a number of tokens >= 0 \(layer 1 head 0: "):
            torch.ops.spanformer.plot_spans([1.0, 2.0, bad, 4.0], 2, str(tmp_path / "s.png"), 64)
    assert not (tmp_path / "s.png").exists()


def test_plot_spans_refuses_ragged_layers_and_draws_the_grid(tmp_path):
    """spanformer.plot_spans: layers of different head counts are a ValueError; the grid layout draws
    and writes the numbers beside the picture, as given."""
    with pytest.raises(ValueError, match="layers of the same number of heads"):
        spanformer.plot_spans([[1.0, 2.0], [3.0]], tmp_path / "x.png", 64)
    out = spanformer.plot_spans([[1.5, 30.0, 200.0], [4.0, 64.0, 10.0]], tmp_path / "g.png", 256, layout="grid")
    assert os.path.getsize(out) > 1000
    numbers = json.load(open(tmp_path / "g.json"))
    assert numbers["spans"] == [[1.5, 30.0, 200.0], [4.0, 64.0, 10.0]] and numbers["layout"] == "grid"


def test_a_picture_too_large_to_draw_is_one_line(tmp_path):
    """3000 layers in the grid layout would be a picture taller than the 32767 pixels a side Cairo can
    draw: one line saying so and what to show less of, and no file written."""
    out = tmp_path / "tall.png"
    with pytest.raises(RuntimeError, match=r"^cannot draw .*tall.png: \d+ x \d+ pixels, beyond the 32767 a side"):
        spanformer.plot_spans([[10.0]] * 3000, out, 64, layout="grid")
    assert not out.exists()


class Gpt(torch.nn.Module):
    """The GPT family's model (include/spanformer/models/gpt.h: learned positions, pre-norm blocks, exact
    GELU, tied output) from spanformer.nn.CausalAttention and torch.nn, with the C++ names."""

    def __init__(self, V, T, H, K, layers, **attention):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, H), torch.nn.Embedding(T, H)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "ln1": torch.nn.LayerNorm(H), "attn": snn.CausalAttention(H, K, **attention), "ln2": torch.nn.LayerNorm(H),
            "fc1": torch.nn.Linear(H, 4 * H), "fc2": torch.nn.Linear(4 * H, H)}) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(H)

    def forward(self, ids):
        h = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for b in self.blocks:
            h = h + b["attn"](b["ln1"](h))
            h = h + b["fc2"](torch.nn.functional.gelu(b["fc1"](b["ln2"](h))))
        return self.ln_f(h) @ self.wte.weight.t()


@pytest.mark.parametrize("kind,flags", [("flash", ["--attention=dense"]), ("window", ["--attention=window", "--window=9"]),
                                        ("adaptive_span", ["--attention=adaptive_span", "--adapt_span_init=0.2"])])
def test_causal_attention_with_a_gpt_checkpoints_tensors_gives_its_logits(kind, flags, cli, shared, tmp_path):
    """A GPT trained by the command line (a few steps, so nothing sits at its initial value), its
    tensors loaded by name into a model built from CausalAttention: the command's model's logits within
    1e-5 (float32, other summation orders) on 48 tokens; the window (9) and the spans (z 12.8, ramp 4)
    are shorter than the context, so their masks matter."""
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:100000])
    cli("data", "prepare", str(text), "--out", str(tmp_path / "data"))
    run = str(tmp_path / "run")
    cli("train", "-c", os.path.join(HERE, "..", "..", "configs", "gpt", "demo.json"), "--data", str(tmp_path / "data"),
        "--out", run, "--n_layer=2", "--d_model=32", "--n_head=2", "--context=64", "--batch_size=4", "--nb_steps=5",
        "--eval_interval=5", "--eval_blocks=1", "--eval_batch_size=2", "--lr_warmup=0", "--adapt_span_ramp=4",
        "--quiet", *flags)
    ours = spanformer.load(run)
    extra = {"window": 9} if kind == "window" else {"attn_span": 64, "ramp": 4} if kind == "adaptive_span" else {}
    model = Gpt(len(ours.vocab), 64, 32, 2, 2, kind=kind, **extra)
    model.load_state_dict(ours.state_dict(), strict=True)
    ids = [(5 * i + 3) % len(ours.vocab) for i in range(48)]
    with torch.no_grad():
        got = model(torch.tensor([ids]))[0]
    want = ours.logits(ids)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    if kind == "adaptive_span":
        assert model.blocks[0]["attn"].span.spans() == pytest.approx(ours.spans()[0].tolist(), abs=1e-4)


def test_sizes_coefficients_and_loaded_spans_out_of_range_are_refused():
    """What the modules would otherwise take silently: a fractional size (truncated), a negative or NaN
    loss coefficient, span ratios outside [0, 1] or NaN in a state dict, NaN or negative spans to draw.
    Each a ValueError with a one-line message naming the argument."""
    with pytest.raises(ValueError, match=r"^AdaptiveSpan: attn_span must be a whole number >= 1 \(got 100.5\)$"):
        snn.AdaptiveSpan(100.5, 4)
    assert snn.AdaptiveSpan(128.0, 4).attn_span == 128  # a whole float is a size
    with pytest.raises(ValueError, match=r"^AdaptiveSpanAttention: d_model must be a whole number >= 1 \(got 64.5\)$"):
        snn.AdaptiveSpanAttention(64.5, 4, attn_span=32)
    with pytest.raises(ValueError, match=r"^CausalAttention: window must be a whole number >= 1 \(got 7.5\)$"):
        snn.CausalAttention(64, 4, kind="window", window=7.5)
    for bad in (-1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"^AdaptiveSpan: loss_coeff must be a finite number in \[0.0, inf\]"):
            snn.AdaptiveSpan(64, 2, loss_coeff=bad)
    span = snn.AdaptiveSpan(64, 2)
    for ratios in ([0.5, 1.5], [-0.1, 0.2], [float("nan"), 0.2]):
        with pytest.raises(ValueError, match=r"^AdaptiveSpan: span_ratio holds values outside \[0, 1\] \(or NaN\)"):
            span.load_state_dict({"span_ratio": torch.tensor(ratios)})
    span.load_state_dict({"span_ratio": torch.tensor([0.0, 1.0])})  # the ends are spans
    assert span.spans() == [0.0, 64.0]
