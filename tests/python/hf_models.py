"""Small random models of Hugging Face transformers for tests/python/test_oracles.py (CPU) and
tests/python/test_cuda.py (GPU): the same weights twice, attention `eager` (transformers' own) and
`spanformer` (spanformer.hf)."""
import torch

KINDS = ("gpt2", "llama", "mistral")


def hf_pair(kind, hidden=64, heads=4):
    """kind: gpt2 | llama (grouped-query attention: `heads` query heads share heads / 2 key/value heads) |
    mistral (the same with sliding-window layers of 8 keys). Head width hidden / heads. float32, CPU,
    eval mode; returns (eager, ours)."""
    import transformers
    import spanformer.hf
    transformers.logging.set_verbosity_error()
    spanformer.hf.register()
    torch.manual_seed(3)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=97, n_positions=128, n_embd=hidden, n_layer=2, n_head=heads)
        cls = transformers.GPT2LMHeadModel
    elif kind == "llama":
        config = transformers.LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden,
                                          num_hidden_layers=2, num_attention_heads=heads,
                                          num_key_value_heads=heads // 2, max_position_embeddings=128)
        cls = transformers.LlamaForCausalLM
    elif kind == "mistral":
        config = transformers.MistralConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden,
                                            num_hidden_layers=2, num_attention_heads=heads,
                                            num_key_value_heads=heads // 2, max_position_embeddings=128,
                                            sliding_window=8)
        cls = transformers.MistralForCausalLM
    else:
        raise ValueError(f"hf_pair: kind {kind!r}: expected one of {', '.join(KINDS)}")
    eager = cls._from_config(config, attn_implementation="eager").eval()
    ours = cls._from_config(config, attn_implementation="spanformer").eval()
    ours.load_state_dict(eager.state_dict())
    assert ours.config._attn_implementation == "spanformer"
    return eager, ours


def prompt_ids(device="cpu"):
    """Two rows of 40 tokens (longer than Mistral's 8-key window, so the band matters): (2, 40)."""
    return torch.tensor([[(7 * i + 3) % 97 for i in range(40)], [(11 * i + 5) % 97 for i in range(40)]], device=device)
