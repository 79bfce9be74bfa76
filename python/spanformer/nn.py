"""Adaptive span as PyTorch modules, over spanformer's operators: what a PyTorch user puts in their own
model. The semantics are the reference's (facebookresearch/adaptive-span) and the C++ library's
(include/spanformer/nn/adaptive_span.h, include/spanformer/attention/seq_attention.h); the parameter
names are the C++ modules', so a layer's tensors of a spanformer checkpoint load into these modules as
they are (spanformer.load(run).state_dict(), keys "layers.<l>.attn.<name>" -> AdaptiveSpanAttention
"<name>").

    span = AdaptiveSpan(attn_span=1024, nb_heads=8, ramp=32, loss_coeff=2e-6)
    attn = AdaptiveSpanAttention(d_model=512, nb_heads=8, attn_span=1024)
    out = attn(h, cache, key_pe)          # h (B, M, H), cache (B, C, H), key_pe (D, L) -> (B, M, H)
    loss = nll + attn.span.loss()         # the span's L1 term
    ...; opt.step(); attn.span.clamp_()   # after every update: spans in [0, 1], host sizes refreshed

Both run on the CPU and on CUDA, and torch.compile(fullgraph=True) traces them: the sizes that depend on
the spans (how many cached keys a layer reads) come from a host copy of the spans that clamp_() refreshes,
never from a device read inside forward.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import spanformer


def _size(where, name, value, least=1):
    """A whole number >= least (an int, or a float with no fraction), else a ValueError naming it: a
    fractional size would otherwise be truncated without a word."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or \
            (isinstance(value, float) and not value.is_integer()) or value < least:
        raise ValueError(f"{where}: {name} must be a whole number >= {least} (got {value!r})")
    return int(value)


def _real(where, name, value, least=0.0, most=math.inf):
    """A finite number in [least, most], else a ValueError naming it (NaN and negatives refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not least <= value <= most:
        raise ValueError(f"{where}: {name} must be a finite number in [{least}, {most}] (got {value!r})")
    return float(value)


class AdaptiveSpan(nn.Module):
    """Each head h learns span_ratio[h] in [0, 1]; its span is z_h = span_ratio[h] * L, and attention at
    distance d (1 = the nearest earlier key) is multiplied by the soft mask

        m_z(d) = clamp((R + z - (d - 1)) / R, 0, 1)

    then renormalised by the row's sum + 1e-8. The span loss is loss_coeff * L * mean(span_ratio). Compute
    follows the spans: with S = clamp(ceil(max_h z_h) + R, 0, L) a layer needs only the last
    L' = L - trim_len keys, trim_len = 64 floor(min(L - 1, L - S) / 64), and its cache keeps
    min(L, L' + 64) states (L with cache=False).

    Parameter: span_ratio (K,). The reference's AdaptiveMask keeps the same numbers as current_val of
    shape (K, 1, 1)."""

    def __init__(self, attn_span, nb_heads, ramp=32, init=0.0, loss_coeff=0.0, cache=True):
        super().__init__()
        w = "AdaptiveSpan"
        attn_span, nb_heads, ramp = _size(w, "attn_span", attn_span), _size(w, "nb_heads", nb_heads), _size(w, "ramp", ramp)
        if not (isinstance(init, (int, float)) and not isinstance(init, bool) and 0.0 <= init <= 1.0):
            raise ValueError(f"AdaptiveSpan: init {init!r} is a span ratio, in [0, 1]")
        self.attn_span, self.nb_heads, self.ramp = attn_span, nb_heads, ramp
        self.loss_coeff, self.cache = _real(w, "loss_coeff", loss_coeff), bool(cache)
        self.span_ratio = nn.Parameter(torch.full((nb_heads,), float(init)))
        self._set_host([float(init)] * nb_heads)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        ratios = state_dict.get(prefix + "span_ratio")
        if ratios is not None and isinstance(ratios, torch.Tensor) and ratios.numel() and \
                not bool(((ratios >= 0) & (ratios <= 1)).all()):
            raise ValueError(f"AdaptiveSpan: {prefix}span_ratio holds values outside [0, 1] (or NaN): "
                             f"{ratios.detach().cpu().tolist()!r:.120}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.sync_host()

    def sync_host(self):
        """Refreshes the host copy of the spans from span_ratio (one device read)."""
        self._set_host([float(r) for r in self.span_ratio.detach().cpu()])

    def _set_host(self, ratios):
        # The host copy, and from it the sizes as integers: forward reads only those, so a compiled
        # graph is specialised on them (it recompiles when a layer's trim moves by 64) and not on the
        # spans themselves, which move every step.
        self._host = ratios
        L = self.attn_span
        self._max = max(0, min(L, math.ceil(max(ratios) * L) + self.ramp))
        self._trim = min(L - 1, L - self._max) // 64 * 64

    def mask(self, width):
        """The soft mask over the last `width` distances: (K, width), column j = distance width - j."""
        d = torch.arange(width, 0, -1, dtype=self.span_ratio.dtype, device=self.span_ratio.device)  # (width,)
        z = self.span_ratio.unsqueeze(1) * self.attn_span                                           # (K, 1)
        return ((self.ramp + z - (d - 1)) / self.ramp).clamp(0, 1)

    def forward(self, attn, normalize=True):
        """attn (B, K, M, W): probabilities over the last W <= L distances -> masked, and renormalised
        by each row's sum + 1e-8 when `normalize`."""
        attn = attn * self.mask(attn.shape[-1]).unsqueeze(1)                                        # (B, K, M, W)
        return attn / (attn.sum(-1, keepdim=True) + 1e-8) if normalize else attn

    def loss(self):
        """The span loss, loss_coeff * L * mean(span_ratio) (a 0-dim tensor)."""
        return self.loss_coeff * self.attn_span * self.span_ratio.mean()

    @torch.no_grad()
    def clamp_(self):
        """After each optimizer step: span_ratio into [0, 1], and the host copy refreshed."""
        self.span_ratio.clamp_(0, 1)
        self.sync_host()

    def spans(self):
        """z_h in tokens, from the host copy."""
        return [r * self.attn_span for r in self._host]

    def max_size(self, include_ramp=True):
        """S = clamp(ceil(max_h z_h) + R, 0, L)."""
        if include_ramp:
            return self._max
        return max(0, min(self.attn_span, math.ceil(max(self._host) * self.attn_span)))

    def trim_len(self):
        """Keys of the L a layer can skip: 64 floor(min(L - 1, L - S) / 64)."""
        return self._trim

    def used_span(self):
        """L' = L - trim_len: the keys a layer reads."""
        return self.attn_span - self.trim_len()

    def cache_size(self):
        """The states a layer's cache keeps: min(L, L' + 64), or L without an adaptive cache."""
        return min(self.attn_span, self.used_span() + 64) if self.cache else self.attn_span


class AdaptiveSpanAttention(nn.Module):
    """Multi-head attention over a cache of earlier hidden states with learned relative positions and an
    adaptive span (the reference's MultiHeadSeqAttention), by spanformer.adaptive_span_attention.

    For query i of a block of M (absolute position C + i), the keys are the L' states before it, never
    itself (distances d = 1 .. L'), scored as (q_i . k_{i-d} + q_i . key_pe[:, L - d]) / sqrt(D), then
    softmax over all L' distances, the span mask, renormalisation by the row sum + 1e-8, and dropout.
    A cache shorter than L' is left-padded with zeros (states before the start), as the reference does.

    Parameters (the C++ SeqAttention's names): proj_query, proj_key, proj_val, proj_out (H x H, no
    bias) and span.span_ratio (K,). key_pe (D, L), column j = distance L - j, belongs to the model (one
    for all layers in the reference) and comes with each call."""

    def __init__(self, d_model, nb_heads, attn_span, ramp=32, init=0.0, loss_coeff=0.0, dropout=0.0, cache=True):
        super().__init__()
        w = "AdaptiveSpanAttention"
        d_model, nb_heads = _size(w, "d_model", d_model), _size(w, "nb_heads", nb_heads)
        if d_model % nb_heads:
            raise ValueError(f"AdaptiveSpanAttention: d_model {d_model} is not a multiple of nb_heads {nb_heads}")
        self.d_model, self.nb_heads, self.dropout = d_model, nb_heads, _real(w, "dropout", dropout, 0.0, 0.999999)
        self.proj_query, self.proj_key, self.proj_val, self.proj_out = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.span = AdaptiveSpan(attn_span, nb_heads, ramp, init, loss_coeff, cache)

    def forward(self, h, cache, key_pe):
        """h (B, M, H) the block's input; cache (B, C, H) earlier inputs (any C >= 0); key_pe (D, L)
        -> (B, M, H)."""
        B, M, H = h.shape
        K, D, Lp = self.nb_heads, H // self.nb_heads, self.span.used_span()
        kept = cache[:, max(0, cache.shape[1] - Lp):]                                  # (B, <= L', H)
        if kept.shape[1] < Lp:                                                         # zeros before the start
            kept = torch.cat([kept.new_zeros(B, Lp - kept.shape[1], H), kept], 1)     # (B, L', H)
        context = torch.cat([kept, h], 1)                                              # (B, L' + M, H)
        q = self.proj_query(h).view(B, M, K, D).transpose(1, 2)                        # (B, K, M, D)
        k = self.proj_key(context).view(B, Lp + M, K, D).transpose(1, 2)               # (B, K, L' + M, D)
        v = self.proj_val(context).view(B, Lp + M, K, D).transpose(1, 2)               # (B, K, L' + M, D)
        # The op's query i reads rows i .. i + L' - 1 of k: the L' states before it (window W = L').
        out = spanformer.adaptive_span_attention(q.contiguous(), k.contiguous(), v.contiguous(), key_pe,
                                                 self.span.span_ratio, self.span.attn_span, float(self.span.ramp),
                                                 self.dropout, self.training)                  # (B, K, M, D)
        return self.proj_out(out.transpose(1, 2).reshape(B, M, H))                     # (B, M, H)

    def cache_size(self):
        return self.span.cache_size()


class CausalAttention(nn.Module):
    """Causal self-attention for decoder models (the GPT family's, include/spanformer/attention/
    causal_attention.h): x (B, N, H) -> (B, N, H), K heads of D = H / K, query i reading keys j <= i.

        kind="flash"          every earlier key and itself: spanformer.flash_attention (fused CPU kernel,
                              CUDA kernels; no N x N tensor)
        kind="window"         the last `window` keys, itself included: the same op with band = window
        kind="adaptive_span"  every head's soft span inside the softmax, a_ij ~ m_z(d) exp(s_ij) with
                              d = i - j + 1 and m_z(d) = clamp((R + z - (d - 1)) / R, 0, 1) (the paper's
                              eq. 7; the GPT family's, without the reference's 1e-8 Z term), z = ratio L,
                              L = attn_span: PyTorch's scaled_dot_product_attention with the float mask
                              log m (differentiable in the spans); span.loss() and span.clamp_() as in
                              AdaptiveSpanAttention

    Parameters (the GPT family's names, so `blocks.<l>.attn.*` of a GPT checkpoint load as they are):
    qkv (H -> 3 H, bias), proj (H -> H, bias), and with adaptive_span span.span_ratio (K,)."""

    def __init__(self, d_model, nb_heads, kind="flash", window=128, attn_span=1024, ramp=32, init=0.0,
                 loss_coeff=0.0, dropout=0.0):
        super().__init__()
        w = "CausalAttention"
        if kind not in ("flash", "window", "adaptive_span"):
            raise ValueError(f"CausalAttention: kind {kind!r}: expected 'flash', 'window' or 'adaptive_span'")
        d_model, nb_heads, window = _size(w, "d_model", d_model), _size(w, "nb_heads", nb_heads), _size(w, "window", window)
        if d_model % nb_heads:
            raise ValueError(f"CausalAttention: d_model {d_model} is not a multiple of nb_heads {nb_heads}")
        self.kind, self.nb_heads, self.window = kind, nb_heads, window
        self.dropout = _real(w, "dropout", dropout, 0.0, 0.999999)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        if kind == "adaptive_span":
            self.span = AdaptiveSpan(attn_span, nb_heads, ramp, init, loss_coeff)

    def forward(self, x):
        B, N, H = x.shape
        K, D = self.nb_heads, H // self.nb_heads
        q, k, v = self.qkv(x).view(B, N, 3, K, D).permute(2, 0, 3, 1, 4)              # (B, K, N, D) each
        drop = self.dropout if self.training else 0.0
        if self.kind == "adaptive_span":
            i = torch.arange(N, device=x.device)
            d = (i.unsqueeze(1) - i.unsqueeze(0) + 1).to(q.dtype)                        # (N, N): 1 = itself
            z = (self.span.span_ratio * self.span.attn_span).to(q.dtype).view(K, 1, 1)
            m = ((self.span.ramp + z - (d - 1)) / self.span.ramp).clamp(0, 1)           # (K, N, N)
            m = m.masked_fill((d < 1) | (d > self.span.attn_span), 0.0)
            if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=m.log(), dropout_p=drop)
            else:  # PyTorch 1.13: the same composition written out
                a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + m.log(), -1)            # (B, K, N, N)
                out = F.dropout(a, drop, self.training) @ v
        else:
            out = spanformer.flash_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                             band=self.window if self.kind == "window" else 0, dropout=drop,
                                             training=self.training and drop > 0)          # (B, K, N, D)
        return self.proj(out.transpose(1, 2).reshape(B, N, H))                           # (B, N, H)
