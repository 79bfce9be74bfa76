"""spanformer's flash attention inside Hugging Face transformers models.

    import spanformer.hf
    spanformer.hf.register()                       # once; returns "spanformer"
    model = GPT2LMHeadModel.from_pretrained(path, attn_implementation="spanformer")
    # or model.set_attn_implementation("spanformer") on a model already built

After register(), any transformers model whose attention layers go through transformers'
AttentionInterface (GPT-2, Llama, Mistral, Qwen, ...) computes its causal self-attention with
spanformer.flash_attention: the fused CPU kernel, the CUDA kernels on a GPU, no N x C score tensor. The
layers' query, key and value arrive as (B, heads, N, D) and (B, kv_heads, C, D) with C - N earlier
tokens in the cache; query i sits at key position C - N + i, which is the op's own convention, so
generation with a KV cache needs nothing more. What it maps:
  - a layer's `scaling` other than D^-1/2: the queries are rescaled before the op (which uses D^-1/2);
  - grouped-query attention (kv_heads < heads): each key/value head serves heads / kv_heads query heads;
  - `sliding_window` (Mistral-style layers): the op's band, the last `sliding_window` keys;
  - `softcap` (Gemma 2's soft-capped scores) and `s_aux` (GPT-OSS's attention sinks): the op's own;
  - dropout in training: the op's hashed dropout, seeded from torch's generator (other masks than
    eager's, the same distribution);
  - padded batches (left padding, as batched generation pads, or right padding, as fine-tuning
    collators pad): the 2-D attention_mask that transformers' FlashAttention-2 mask function passes
    (registered beside it: None for unpadded batches), or a 4-D mask that is a causal mask with padding
    (bool, or float with 0 where kept), becomes the op's key_ranges, each row's [first, end) of real
    tokens. Padded positions give 0 (eager gives them values no token reads).
What it refuses, with a one-line ValueError naming the way out (attn_implementation "sdpa" or "eager"):
masks that are not one run of real tokens per row (a 0 between two 1s, or a 4-D mask of another
pattern), non-causal layers (encoders, cross-attention, is_causal=False), attention weights asked for
(output_attentions: the op never forms them), and packed sequences (position_ids restarting within an
unpadded row). (The name has no "flash" in it: transformers takes any implementation named "...flash..."
for a FlashAttention kernel to fetch from its hub.)
"""
import torch

import spanformer

NAME = "spanformer"


def _attention_weights_asked():
    """Whether the model's forward was asked for attention weights (output_attentions=True): transformers
    5 collects them with forward hooks on the attention modules, whose collector it keeps in a context
    variable; older versions pass output_attentions to the attention function."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return False
    collected = _active_collector.get()
    return bool(collected) and any(k in collected for k in ("attentions", "cross_attentions"))


def _packed(position_ids, query):
    """Whether one row holds several sequences one after another (positions that restart: 0 1 2 0 1 ...),
    as transformers' FlashAttention-2 path reads them: only a batch of one row of several queries is read
    (one device read per layer there); a KV-cache step or a batch of rows is never packed."""
    if position_ids is None or query.shape[0] != 1 or query.shape[-2] == 1 or position_ids.shape[-1] <= 1:
        return False
    pos = position_ids.reshape(-1)
    return bool((pos[1:] - pos[:-1] != 1).any())


def _runs(valid):
    """(B, 2) int64 [first, end) of each row's real tokens from valid (B, C) bool, or None where a row's
    real tokens are not one run."""
    B, C = valid.shape
    pos = torch.arange(C, device=valid.device)
    count = valid.sum(-1)                                                          # (B)
    first = torch.where(valid, pos, C).min(-1).values                              # (B)
    end = torch.where(valid, pos + 1, 0).max(-1).values                            # (B)
    first = torch.where(count > 0, first, 0)
    end = torch.where(count > 0, end, 0)
    if bool((end - first != count).any()):
        return None
    return torch.stack([first, end], -1)


def _key_ranges(attention_mask, query, key, band):
    """The op's key_ranges (B, 2) for transformers' mask, None for no padding; the keys the mask covers
    (a static cache's mask is shorter than its keys: the rest is unwritten). A mask that is not padding of
    one run per row is a ValueError."""
    N, C = query.shape[-2], key.shape[-2]
    refuse = ValueError(f"{NAME}: this attention_mask is not a causal mask with padding (one run of real tokens per "
                        "row); use attn_implementation='sdpa' for it")
    if attention_mask.dim() == 2:  # (B, C'): transformers' FlashAttention-2 mask function's, 1 = a real token
        valid = attention_mask[:, -C:] != 0
        ranges = _runs(valid)
        if ranges is None:
            raise refuse
        return ranges, valid.shape[1]
    if attention_mask.dim() != 4:
        raise refuse
    # (B, 1 or H, N, C'): kept where True (bool) or 0 (float, -inf or the dtype's minimum elsewhere)
    kept = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    kept = kept[..., -C:]
    Ck = kept.shape[-1]
    if kept.shape[-2] != N:
        raise refuse
    ranges = _runs(kept.any(-2).any(1))                                            # keys any query reads
    if ranges is None:
        raise refuse
    qpos = torch.arange(Ck - N, Ck, device=kept.device).view(1, N, 1)               # (1, N, 1)
    kpos = torch.arange(Ck, device=kept.device).view(1, 1, Ck)                      # (1, 1, C')
    first, end = ranges[:, 0].view(-1, 1, 1), ranges[:, 1].view(-1, 1, 1)           # (B, 1, 1)
    expected = (kpos <= qpos) & (kpos >= first) & (kpos < end)                       # (B, N, C')
    if band:
        expected &= qpos - kpos < band
    real = (qpos >= first) & (qpos < end)                                            # (B, N, 1): rows a token reads
    if not bool(((kept == expected.unsqueeze(1)) | ~real.unsqueeze(1)).all()):
        raise refuse
    if bool((ranges == torch.tensor([0, Ck], device=ranges.device)).all()) and Ck == C:
        return None, C
    return ranges, Ck


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
               **kwargs):
    """transformers' attention-function signature: query (B, H, N, D), key and value (B, Hkv, C, D) ->
    ((B, N, H, D), None)."""
    band = int(sliding_window) if sliding_window else 0
    key_ranges = None
    if attention_mask is not None:
        key_ranges, kept = _key_ranges(attention_mask, query, key, band)
        if kept < key.shape[-2]:  # a static cache: its unwritten slots after the mask's keys
            key, value = key[..., :kept, :], value[..., :kept, :]
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if not is_causal or key.shape[-2] < query.shape[-2]:
        raise ValueError(f"{NAME}: only causal self-attention is supported (this layer is not); "
                         "use attn_implementation='sdpa' for it")
    if kwargs.get("output_attentions") or _attention_weights_asked():
        raise ValueError(f"{NAME}: attention weights are never formed; use attn_implementation='eager' for them")
    if attention_mask is None and _packed(kwargs.get("position_ids"), query):
        raise ValueError(f"{NAME}: packed sequences (position_ids restarting within a row) would attend across "
                         "their boundaries; give each sequence a row of its own, or use attn_implementation='sdpa' "
                         "with a mask")
    D = query.shape[-1]
    if scaling is not None and abs(scaling * D ** 0.5 - 1.0) > 1e-12:
        query = query * (scaling * D ** 0.5)  # the op divides by sqrt(D)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    training = bool(getattr(module, "training", False)) and dropout > 0
    softcap = float(kwargs.get("softcap") or 0.0)  # Gemma 2's attn_logit_softcapping: tanh-capped scores
    sinks = kwargs.get("s_aux")  # GPT-OSS's sinks: a learned logit per head in every row's softmax
    out = spanformer.flash_attention(query, key, value, band=band, dropout=float(dropout) if training else 0.0,
                                     training=training, softcap=softcap, sinks=sinks, key_ranges=key_ranges)
    return out.transpose(1, 2), None  # (B, N, H, D)


def register():
    """Registers "spanformer" with transformers' AttentionInterface and AttentionMaskInterface
    (the mask function of FlashAttention-2: None for unpadded batches). Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME
