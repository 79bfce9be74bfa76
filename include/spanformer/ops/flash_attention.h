// FlashAttention (Dao et al., 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
// IO-Awareness"; FlashAttention-2, Dao 2023, for the loop order): exact causal softmax attention computed
// tile by tile with an online softmax, so that no N x C score or probability tensor is ever stored, in
// forward or in backward. The GPT family's `model.attention = flash` (attention/causal_attention.h).
//
// Formula (the one every causal pattern shares, with m in {0, 1}): query i at key position p_i = C - N + i
// reads the keys j with p_i - band < j <= p_i (band = C: the dense causal mask; band = w: a sliding
// window),
//     s_ij = q_i . k_j / sqrt(D),   P_ij = exp(s_ij - L_i),   L_i = log sum_j exp(s_ij)   (logsumexp),
//     out_i = sum_j P_ij Z_ij v_j,   Z_ij = keep_ij / (1 - p_drop)   (Z = 1 without dropout)
//
// Forward, per query tile Q_t (rows i0 .. i0 + n - 1) and key tiles K_u taken from the diagonal backwards
// (the diagonal tile holds every row's own key first, so each row's running maximum is finite from the
// first tile on):   S = Q_t K_u^T / sqrt(D);  m' = max(m, rowmax S);  l = l e^{m - m'} + rowsum e^{S - m'};
//   acc = acc e^{m - m'} + (e^{S - m'} Z) V_u;  at the end out = acc / l and L = m + log l.
// Saved for backward: q, k, v, out and L (B, K, N): O(N) beyond the inputs.
// Backward, same tiles, recomputing P = exp(S - L) (Dao 2022, alg. 4):
//   Dv_i = dout_i . out_i;  dV_u += (P Z)^T dO_t;  dP = (dO_t V_u^T) Z;  dS = P (dP - Dv);
//   dQ_t += dS K_u / sqrt(D);  dK_u += dS^T Q_t / sqrt(D).
// (rowsum(dP P) = dout . out holds with dropout too, since out already carries Z.)
//
// Soft-capping and sinks (Gemma 2, GPT-OSS): with softcap c > 0 every score is c tanh(s_ij / c) before the
// softmax, and dS picks up the factor 1 - tanh^2; a sink logit sigma_h joins every row's normaliser
// (L_i = log(sum_j e^{s_ij} + e^{sigma_h}): the running maximum and sum start at sigma_h and 1), and its
// gradient is -sum_i e^{sigma_h - L_i} Dv_i over the head's rows. The CUDA kernels take neither: the
// ATen tiles compute them on a GPU.
//
// Padded batches (key_ranges, FlashAttention-2's variable-length batches in another form): row b reads the
// keys first_b <= j < end_b only, and its queries outside that range are empty (out 0, L = -inf). The
// ATen tiles mask them; the fused CPU kernel computes each row's real tokens in place as a problem of its
// own, queries [max(first_b, C - N), end_b) over keys [first_b, end_b) (the same formula on fewer tokens,
// dropout hashing their true positions); the CUDA kernels run them as batches of one, copied out and back
// (flash_forward_by_rows), and so not with dropout, which the ATen tiles then run.
//
// Dropout: keep_ij is the splitmix64 hash of (seed, batch, head, p_i, j) (ops/dropout_hash.h), so
// backward regenerates the forward's mask without storing it, and the reference composition below
// drops exactly the same weights. The seed is drawn from the default generator per call (checkpoints
// save it, so a resumed run drops the same weights).
//
// Dims: B batch, K heads, N queries, C keys (C >= N, the first C - N from a KV cache), D head width,
// X = B K. Tiles are batched over X: each step is one batched product over all heads (ATen's kernels,
// vectorised and threaded), tile x tile scores at a time. Any device ATen runs on; tests hold the CPU path
// to the reference in double precision (values and gradients, with and without dropout, N < C, bands).
// On CUDA, `cuda_kernel` selects the hand-written kernels instead (src/ops/cuda/flash_attention_kernels.cu,
// float32 / bfloat16 / float16, D <= 256; versions in docs/kernels.md), the same formulas and dropout
// hash: the GPT family's `attn_impl = fused`; `auto` keeps the ATen tiles until the kernels are measured
// faster on a GPU. Double precision and other widths always take the ATen tiles.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::ops {

struct FlashOptions {
  int64_t band = 0;        // keys per query, itself included (0 = every earlier key: dense causal)
  double dropout = 0.0;    // p_drop on the probabilities, when training
  bool training = false;
  uint64_t seed = 0;       // dropout hash seed (flash_attention draws one when 0 and dropout is on)
  int64_t tile = 256;      // queries and keys per tile (docs/benchmarks.md: 256 beat 64 and 128 on CPU)
  bool cuda_kernel = false;  // CUDA inputs: the hand-written kernels (tile unused) instead of ATen tiles
  // Gemma 2's soft-capped scores: s = softcap tanh(s / softcap) before the softmax (0 = none).
  double softcap = 0.0;
  // Attention sinks (GPT-OSS): a learned logit per head, (K), in every row's softmax with no value:
  // L_i = log(sum_j exp(s_ij) + exp(sinks_h)). Undefined = none. Differentiable.
  at::Tensor sinks;
  // Padded batches: (B, 2) integers, row b's keys [first, end) (left padding before `first`, right padding
  // from `end`, positions 0 .. C); keys outside are masked, and a query whose position p_i is outside
  // has no key: its output and gradients are 0. Undefined = every key. Not differentiable.
  at::Tensor key_ranges;
};

// q (B, K, N, D); k, v (B, K, C, D) with C >= N >= 1, one dtype and device. Returns (B, K, N, D),
// differentiable in q, k and v by the tiled backward above. Validates once (one-line errors).
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, FlashOptions options = {});
// The name of the row of the op's backend table that serves inputs like q: "cuda", "cpu" or "tiles".
const char* flash_attention_backend(const at::Tensor& q, bool cuda_kernel = true);
// The rows of the table in this build, in the order they are asked.
std::vector<std::string> flash_attention_backends();

// How the CPU kernels multiply bfloat16 / float16 inputs, for the whole process (src/ops/cpu/tile_gemm.h):
// "native" (16-bit operands, float32 accumulation; `auto` picks it where the CPU has AMX) or "widened"
// (converted to float32 first). A non-empty mode ("auto", "widened", "native") sets it; returns what
// bfloat16 inputs get now. SPANFORMER_CPU_HALF_PRODUCTS sets the starting mode.
std::string cpu_half_products(const std::string& mode = "");

// For tests and benchmarks: while it lives, every call of the op (forward and backward, any thread)
// runs on the named row, and a call that row cannot take is a one-line error. Not for concurrent use
// with other overrides.
class FlashBackendOverride {
 public:
  explicit FlashBackendOverride(const std::string& row);
  ~FlashBackendOverride();
  FlashBackendOverride(const FlashBackendOverride&) = delete;
  FlashBackendOverride& operator=(const FlashBackendOverride&) = delete;

 private:
  int previous_;
};

// The plain composition of the same formula: the whole (B, K, N, C) score tensor, the same dropout
// mask; differentiable by autograd. For tests and the `plain` implementation.
at::Tensor flash_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const FlashOptions& options);

}  // namespace spanformer::ops
