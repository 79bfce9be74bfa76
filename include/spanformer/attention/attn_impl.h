// How an attention layer computes its attention (an execution choice: checkpoints load under any of
// them, and all give the reference's result; tests/test_equivalence.cpp and the ops' tests hold them to
// it).
//   plain  the reference's operations, one batched product per step over the whole window;
//   fused  the layer's fast path: the span-aware op (ops/adaptive_span_attention.h), XL's per-head
//          windowed products, the GPT family's tiles, blocks and kernels;
//   auto   per layer and call, the path the measured rule below expects to be faster. The default.
//
// The auto rules, one per layer kind, each with the measurement behind its constants (the call sites
// gather the sizes; nothing else decides):
//   span_fused           adaptive span (attention/seq_attention.cpp): fused on the CPU, at every window
//                        and span (kernel v5/v6 trains bench_small 1.1-1.4x faster than plain at spans
//                        40 and 540, fp32 and bf16, and evaluates as fast or faster: docs/kernels.md,
//                        "Which path runs"); plain on CUDA, where a bf16 training step with the
//                        kernels (v1 + v2) was within two runs' spread of the plain path and fp32 runs
//                        v0, 2-10x slower (docs/kernels.md, "Training on CUDA with the span kernels");
//   xl_per_head_windows  Transformer-XL / PAR (models/xl.cpp): per-head products once they skip a
//                        quarter of the keys;
//   causal_tiles         GPT banded and grouped patterns (attention/causal_attention.cpp): tiles when
//                        they read at most 3/4 of the N x C pairs per head;
//   sparse_blocks        GPT sparse patterns: blocks when they read at most 3/4 of the N x C pairs;
//   cpu_flash            GPT dense, flash and sliding-window attention on the CPU (auto and fused): the
//                        flash op's fused CPU kernel, the window as its band (docs/kernels.md, "flash_attention
//                        on the CPU": 1.2-1.5x SDPA's forward + backward at T 1k-4k, 2-3x the banded tiles);
//   dense_sdpa           GPT dense and flash on CUDA: PyTorch's fused scaled_dot_product_attention when no KV
//                        cache (N == C) and no attention dropout in training (docs/benchmarks.md,
//                        "What changed": faster than the flash op's tiles on the CPU, 0.80-0.88,
//                        and on CUDA, 0.205 vs 5.1 ms at T 1k, docs/kernels.md);
//   flash_kernels        GPT flash where SDPA does not take it (attention dropout in training): the
//                        CUDA kernels' version 1 for bf16 / fp16 with D 32, 64 or 128 and no KV cache
//                        (H100, T 1k: forward + backward 0.44 ms against the plain composition's 1.16
//                        and the ATen tiles' 5.8; docs/kernels.md, "flash_attention on CUDA"); the
//                        ATen tiles elsewhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::attention {

enum class AttnImpl { kAuto, kFused, kPlain };

// "auto" | "fused" | "plain"; parse fails with a one-line error naming the value.
const char* attn_impl_name(AttnImpl impl);
AttnImpl parse_attn_impl(const std::string& name);

namespace auto_rule {
bool span_fused(bool cuda);
// keys: the layer's keys (memory + segment), queries M; visited as above.
bool xl_per_head_windows(int64_t keys, int64_t queries, const std::vector<int64_t>& visited);
// read: the query-key pairs the tiles read, as a fraction of N x C, summed over the K heads.
bool causal_tiles(double read, int64_t heads);
// blocks: the query-key pairs the sparse blocks read per batch row and head.
bool sparse_blocks(double blocks, int64_t queries, int64_t keys);
bool dense_sdpa(int64_t queries, int64_t keys, bool training, double dropout);
// half: bfloat16 or float16 inputs; head_dim D.
bool flash_kernels(bool cuda, bool half, int64_t head_dim, int64_t queries, int64_t keys);
bool cpu_flash(bool cuda);
}  // namespace auto_rule

}  // namespace spanformer::attention
