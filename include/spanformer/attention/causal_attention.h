// Causal self-attention for decoder-only models (the GPT family, config/gpt_config.h), with the
// attention pattern a drop-in choice. Every pattern is one formula, a masked softmax with per-key
// weights m_h >= 0 of the query and key positions i >= j, for most patterns a function of the distance
// d = i - j + 1 (d = 1: the query itself):
//
//     s_ij = q_i . k_j / sqrt(D),      a_ij = m_h(d_ij) exp(s_ij) / sum_l m_h(d_il) exp(s_il),
//     out_i = sum_j a_ij v_j   (then dropout on a when training)
//
//   dense          m = 1 for d >= 1 (the textbook causal mask; Vaswani et al. 2017, Radford et al. 2019)
//   flash          the same m as dense, computed by ops/flash_attention.h (Dao et al. 2022): tiles with an
//                  online softmax and a backward that recomputes them, no N x C tensor kept; its plain
//                  implementation is that op's reference composition (same dropout mask)
//   window         m = 1 for 1 <= d <= w (sliding window: Longformer / Mistral)
//   adaptive_span  m = nn::AdaptiveSpan's soft mask m_z(d) = clamp((R + z_h - (d - 1)) / R, 0, 1)
//                  (Sukhbaatar et al. 2019, eq. 6) for d <= L (0 beyond the largest span L), which is
//                  1 at d = 1 for every z >= 0, so no row is
//                  ever empty. This is the paper's formula (eq. 7: the mask inside the softmax); the
//                  Python reference's extra 1e-8 (sum of every key's exp) term is not used here, so a
//                  head's result depends only on the keys its span reaches.
//   sparse_strided the Sparse Transformer's strided pattern (Child et al. 2019, stride l):
//                  A1 = {j : i - j < l} (the last l keys), A2 = {j : (i - j) mod l = 0}
//   sparse_fixed   its fixed pattern (stride l, summary c): A1 = {j : floor(j / l) = floor(i / l)} (the
//                  query's own block), A2 = {j : j mod l >= l - c} (the last c keys of every block)
//                  Both with j <= i, m in {0, 1}, combined as the paper's three ways (sparse_combine):
//                  merged (every head A1 u A2), alternating (even layers A1, odd layers A2), per_head
//                  (the first ceil(K / 2) heads A1, the others A2). The query itself is always in, so no
//                  row is empty (A2 of sparse_fixed alone would leave the first l - c queries none).
//
//   lsh            Reformer attention (ops/lsh_attention.h): no fixed m; each query reads, per hashing
//                  round, itself and the `chunk` most recent earlier positions of its bucket, with shared
//                  query/keys (the caller passes k = q) and rounds combined by logsumexp. Reads no KV
//                  cache (C = N); the rotations are drawn from the default generator per call.
//
// Where m_h(d) = 0 the key takes no part: its score is never needed. Each head reads at most the last
// S_h keys, S_h = min(context, band): dense: all; window: w; adaptive span: floor(z_h + R) + 1
// (ops::visited_distance, the one home of that rule). The band reads the spans' host copies
// (nn::AdaptiveSpan::sync_host), which must be current: GptModel::clamp_spans refreshes them after
// every optimizer step and after weights are loaded.
//
// Dims: B batch, K heads, N queries, C keys (C >= N: the last N keys are the queries' own, earlier ones
// come from a KV cache), D head width. Query i sits at key position C - N + i.
//
// Two implementations, one result (tests/test_gpt.cpp holds them together in double precision, values
// and every gradient, including the soft span's):
//   plain  the reference composition: the whole (B, K, N, C) score tensor, masked;
//   fused  query tiles of kQueryTile rows; a tile reads only keys [first - S + 1, last] where S is the
//          largest band of its heads, so tiles above the diagonal and keys beyond every head's span are
//          never touched, and backward stores tile-sized scores only (O(N S) instead of O(N C)). A
//          narrow band (S <= C / 4) takes every tile at once from one strided window of k and v
//          (each tile's own slice would give its backward a gradient the size of k: quadratic).
//          Adaptive span cuts the heads, sorted by S_h, into groups with a band each (the cut that
//          reads the fewest keys, a fixed cost per group counted), so a layer with a few heads near L
//          and the rest short reads S_h keys per head, not the layer's largest span for every head;
//          Sparse patterns block-sparsely: positions as rows of l; a query row reads its near rows
//          (strided: the row before and its own; fixed: its own block) and its far blocks (strided:
//          its column of the earlier rows, read as l causal attentions over C / l rows; fixed: the
//          summary columns of the earlier blocks), one masked softmax over both, other blocks never
//          touched: 2 l + C / l keys per query (strided), l + c C / l (fixed), against C, so compute
//          and memory grow as N^1.5 with l ~ sqrt(N);
//   auto   dense without a KV cache (N = C) and without attention dropout: PyTorch's own fused kernel
//          (at::scaled_dot_product_attention, LibTorch 2.x; measured faster than both above on the CPU,
//          docs/benchmarks.md "What changed"); otherwise
//          fused where the tiles (or blocks) skip a quarter of the query-key pairs or more, else plain;
//          flash: the flash op for fused and auto (on CUDA, fused takes its hand-written kernels and
//          auto its ATen tiles, until the kernels are measured faster: ops/flash_attention.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "spanformer/attention/kinds.h"

namespace spanformer::nn {
class AdaptiveSpanImpl;
}

namespace spanformer::attention {

// CausalKind and SparseCombine: attention/kinds.h.

inline constexpr int64_t kQueryTile = 64;

struct CausalSpec {
  CausalKind kind = CausalKind::kDense;
  int64_t window = 0;                          // w (window)
  const nn::AdaptiveSpanImpl* span = nullptr;  // the heads' spans (adaptive_span)
  int64_t stride = 0, summary = 0;             // l and c (sparse patterns)
  int64_t sparse_groups = 0;                   // sparse, fused: query-row groups (0: 4 from 2^21 pairs per head, else 1)
  int64_t span_groups = 0;                     // adaptive span, fused: head groups by band (0: the cheapest cut)
  SparseCombine combine = SparseCombine::kMerged;
  int64_t layer = 0, heads = 0;                // the layer's index and K (alternating, per_head)
  int64_t lsh_rounds = 1, lsh_buckets = 2, lsh_chunk = 64;  // lsh: R, nb, m
  int64_t flash_tile = 256;                    // flash: queries and keys per tile
  double dropout = 0.0;                        // on a, when training
  bool training = false;
};

// Keys per query a head reads at most (S_h above), the largest over heads; `keys` caps it.
int64_t causal_band(const CausalSpec& spec, int64_t keys);

// m_h at query positions qpos (n, 1) and key positions kpos (1 or n, c), int64 -> (K or 1, n, c) in
// `dtype` (the one home of every pattern). With `heads` (int64 indices): the rows of those heads only
// (K' = |heads|; patterns shared by every head keep their one row).
at::Tensor causal_weights(const CausalSpec& spec, const at::Tensor& qpos, const at::Tensor& kpos, at::ScalarType dtype,
                          const at::Tensor& heads = {});

// q (B, K, N, D); k, v (B, K, C, D), C >= N. Returns (B, K, N, D). Validates once, then dispatches.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CausalSpec& spec,
                            AttnImpl impl = AttnImpl::kAuto);
// The plain composition (any dtype; differentiable by autograd).
at::Tensor causal_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const CausalSpec& spec);

// One query per row at a position held on the device, against a buffer of the whole context (fixed
// shapes: generation's step as a CUDA graph, GptDecoder::fixed_shapes). q (B, K, 1, D); k, v (B, K, T, D)
// with the key of position j in row j (rows past `at` may hold anything finite); at (1) int64 on q's
// device -> (B, K, 1, D): the reference composition with the pattern's weights of query `at` against
// keys 0 .. T - 1, so keys after `at` weigh 0. LSH (no fixed pattern of weights) is refused.
at::Tensor causal_attention_at(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& at,
                               const CausalSpec& spec);

}  // namespace spanformer::attention
