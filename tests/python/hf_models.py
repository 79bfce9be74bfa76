"""Small random models of Hugging Face transformers for tests/python/test_hf.py (CPU) and
tests/python/test_cuda.py (GPU): the same weights twice, attention `eager` (transformers' own) and
`spanformer` (spanformer.hf).

Each model is built from its own copy of the config: transformers' `_from_config(config,
attn_implementation=...)` writes the implementation into the config object it is given, so two models
built from one object would both run the last one named (and an oracle would compare our attention with
itself). `hf_pair` checks what each model runs: the config's name, and the number of calls into
spanformer.flash_attention one forward makes (one per layer for ours, none for eager), counted by
`count_flash_calls`.
"""
import contextlib
import copy

import torch

KINDS = ("gpt2", "gpt2_layer_scaled", "llama", "mistral")
LAYERS = 2


def hf_config(kind, hidden=64, heads=4):
    """kind: gpt2 | gpt2_layer_scaled (GPT-2 whose scores are also divided by the layer number,
    `scale_attn_by_inverse_layer_idx`: a `scaling` other than D^-1/2) | llama (grouped-query attention:
    `heads` query heads share heads / 2 key/value heads) | mistral (the same with sliding-window layers of
    8 keys). Head width hidden / heads. Returns (config, model class)."""
    import transformers
    if kind in ("gpt2", "gpt2_layer_scaled"):
        config = transformers.GPT2Config(vocab_size=97, n_positions=128, n_embd=hidden, n_layer=LAYERS, n_head=heads,
                                         scale_attn_by_inverse_layer_idx=kind == "gpt2_layer_scaled")
        return config, transformers.GPT2LMHeadModel
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden,
                                          num_hidden_layers=LAYERS, num_attention_heads=heads,
                                          num_key_value_heads=heads // 2, max_position_embeddings=128)
        return config, transformers.LlamaForCausalLM
    if kind == "mistral":
        config = transformers.MistralConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden,
                                            num_hidden_layers=LAYERS, num_attention_heads=heads,
                                            num_key_value_heads=heads // 2, max_position_embeddings=128,
                                            sliding_window=8)
        return config, transformers.MistralForCausalLM
    raise ValueError(f"hf_config: kind {kind!r}: expected one of {', '.join(KINDS)}")


@contextlib.contextmanager
def count_flash_calls():
    """Counts the calls into spanformer.flash_attention (what spanformer.hf's attention calls) while the
    block runs: yields a one-element list holding the count."""
    import spanformer
    real = spanformer.flash_attention
    count = [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    spanformer.flash_attention = counting
    try:
        yield count
    finally:
        spanformer.flash_attention = real


def hf_model(kind, implementation, hidden=64, heads=4, seed=3):
    """One model of `kind` with attention `implementation`, built from a config of its own; float32, CPU,
    eval mode, weights drawn from `seed`."""
    import transformers
    import spanformer.hf
    transformers.logging.set_verbosity_error()
    spanformer.hf.register()
    config, cls = hf_config(kind, hidden, heads)
    torch.manual_seed(seed)
    model = cls._from_config(copy.deepcopy(config), attn_implementation=implementation).eval()
    assert model.config._attn_implementation == implementation, model.config._attn_implementation
    return model


def hf_pair(kind, hidden=64, heads=4):
    """(eager, ours): the same weights, transformers' eager attention and spanformer's. Checks that each
    runs what it says: ours calls spanformer.flash_attention once per layer, eager never."""
    eager = hf_model(kind, "eager", hidden, heads)
    ours = hf_model(kind, "spanformer", hidden, heads)
    ours.load_state_dict(eager.state_dict())
    assert eager.config is not ours.config
    ids = prompt_ids()[:1, :5]
    with torch.no_grad():
        with count_flash_calls() as eager_calls:
            eager(ids)
        with count_flash_calls() as our_calls:
            ours(ids)
    assert eager_calls[0] == 0, f"the eager model called spanformer's attention {eager_calls[0]} times"
    assert our_calls[0] == LAYERS, f"our model called spanformer's attention {our_calls[0]} times, not {LAYERS}"
    return eager, ours


def prompt_ids(device="cpu"):
    """Two rows of 40 tokens (longer than Mistral's 8-key window, so the band matters): (2, 40)."""
    return torch.tensor([[(7 * i + 3) % 97 for i in range(40)], [(11 * i + 5) % 97 for i in range(40)]], device=device)
