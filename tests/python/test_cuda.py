"""The Python side on a GPU: Hugging Face transformers' models on spanformer's CUDA flash kernels.

What test_hf.py holds on the CPU, on CUDA: GPT-2, a Llama with grouped-query attention and a
Mistral with 8-key sliding windows, attn_implementation="spanformer" (spanformer.hf) against
transformers' own `eager` on the same device, and the profiler's record that our kernels ran (not a
fallback):
  - float32, head width 16: CUDA version 0 (`forward_kernel`); logits within 1e-5 of eager's and the
    same 20 greedy tokens through generate() (its KV cache: one query against C keys);
  - bfloat16, head width 64: version 1 on the tensor cores (`forward_mma_kernel`); logits as close to
    eager's float32 logits as eager's own bfloat16 run is, within 2x plus 1e-3 of the largest logit (both
    round the same weights and activations to 8 bits of mantissa; the sums run in another order); the
    same for one query against the cache.

CTest runs it as a script (python.cuda, label cuda: scripts/gpu-check.sh and `scripts/test.sh cuda` on a
GPU machine): without a CUDA device it exits with code 77, which CTest reports as skipped; with one it
runs pytest on itself. scripts/test.sh's python stage leaves it out, as it leaves out test_oracles.py.
"""
import inspect
import sys

import pytest
import torch

from hf_models import KINDS, hf_pair, prompt_ids

NO_GPU = not torch.cuda.is_available()
pytestmark = pytest.mark.skipif(NO_GPU, reason="needs a CUDA device")


def kernels_run(fn):
    """Runs fn() under the profiler; returns (its result, the names of the CUDA kernels it launched)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return result, {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def ours_ran(names, kernel):
    """Whether one of spanformer's flash kernels named `kernel` is among the launched kernel names."""
    return any("spanformer::ops::cuda" in n and (kernel + "(" in n or kernel + "<" in n) for n in names)


def cache_arg(model):
    """The name transformers' forward takes the KV cache under: `cache` from 5.24 on, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@pytest.mark.parametrize("kind", KINDS)
def test_transformers_models_in_float32_on_our_cuda_kernels_give_eagers_logits_and_tokens(kind):
    eager, ours = (m.cuda() for m in hf_pair(kind))
    ids = prompt_ids("cuda")
    with torch.no_grad():
        want = eager(ids).logits
        got, names = kernels_run(lambda: ours(ids).logits)
        assert ours_ran(names, "forward_kernel"), sorted(names)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
        prompt = ids[:1, :6]
        args = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
        assert torch.equal(ours.generate(prompt, **args), eager.generate(prompt, **args))


@pytest.mark.parametrize("kind", KINDS)
def test_transformers_models_in_bfloat16_on_our_tensor_core_kernels_are_as_close_as_eagers(kind):
    eager, ours = hf_pair(kind, hidden=256, heads=4)  # head width 64: a width version 1 takes
    eager, ours = eager.cuda(), ours.cuda()
    ids = prompt_ids("cuda")
    with torch.no_grad():
        exact = eager(ids).logits  # (2, 40, 97) float32
        step_exact = eager(ids[:, :30]).logits[:, -1]  # (2, 97): the 30th token's, all 30 at once
        floor = 1e-3 * exact.abs().max().item()
        eager16, ours16 = eager.to(torch.bfloat16), ours.to(torch.bfloat16)
        theirs = eager16(ids).logits.float()
        got, names = kernels_run(lambda: ours16(ids).logits.float())
        assert ours_ran(names, "forward_mma_kernel"), sorted(names)
        err, their_err = (got - exact).abs().max().item(), (theirs - exact).abs().max().item()
        assert err <= 2 * their_err + floor, (err, their_err)
        # One query against the cache (generation's step) on the same kernels, as close again.
        cache = ours16(ids[:, :29], use_cache=True).past_key_values
        step = ours16(ids[:, 29:30], **{cache_arg(ours16): cache}, use_cache=True).logits[:, -1].float()
        step_theirs = eager16(ids[:, :30]).logits[:, -1].float()
        err, their_err = (step - step_exact).abs().max().item(), (step_theirs - step_exact).abs().max().item()
        assert err <= 2 * their_err + floor, (err, their_err)
    if kind == "mistral":  # the bound tells a band from none: dense attention misses it by far (1.4 on the CPU)
        eager16.config.sliding_window = None
        with torch.no_grad():
            assert (eager16(ids).logits.float() - exact).abs().max().item() > 10 * (2 * their_err + floor)


@pytest.mark.parametrize("kind", ("gpt2", "llama", "mistral"))
def test_transformers_padded_batches_on_our_cuda_kernels_give_eagers_logits(kind):
    """Left-, right- and all-but-one-padded rows (the op's key_ranges: each row's real tokens through the
    kernels as a batch of one) against eager at every real token, float32; greedy generation of a
    left-padded batch gives eager's tokens."""
    eager, ours = (m.cuda() for m in hf_pair(kind))
    mask = torch.zeros(4, 20, dtype=torch.long, device="cuda")
    for b, (first, end) in enumerate(((0, 20), (5, 20), (0, 13), (19, 20))):
        mask[b, first:end] = 1
    ids, real = prompt_ids("cuda")[:1, :20].repeat(4, 1) * mask, mask.bool()
    with torch.no_grad():
        want = eager(ids, attention_mask=mask).logits
        got, names = kernels_run(lambda: ours(ids, attention_mask=mask).logits)
        assert ours_ran(names, "forward_kernel"), sorted(names)
        assert torch.allclose(got[real], want[real], atol=1e-5, rtol=0), (got - want)[real].abs().max()
        args = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
        left = ids[1:2].repeat(2, 1)
        left_mask = mask[1:2].repeat(2, 1)
        left_mask[1, :5] = 1
        assert torch.equal(ours.generate(left, attention_mask=left_mask, **args),
                           eager.generate(left, attention_mask=left_mask, **args))


if __name__ == "__main__":
    if NO_GPU:
        print("test_cuda.py: no CUDA device: skipped")
        sys.exit(77)
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
