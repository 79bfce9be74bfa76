// The masked softmax: a softmax over the last axis that only the first `valid` keys of each row take
// part in (Bahdanau et al. 2015 and every padded batch since; d2l.ai section 11.3).
//
//     a_ij = exp(s_ij) / sum_{l < v_i} exp(s_il)   for j < v_i,     a_ij = 0   for j >= v_i
//
// Dims: scores (B, N, C) (or (B, K, N, C): the lengths are shared by the K heads); valid lengths
// either per sequence (B) or per query (B, N), integers in [0, C].
// Invariants: every row sums to 1 when v_i >= 1; a row with v_i = 0 (a query with no key, e.g. an
// empty source sentence) is all zeros, and so are its output and its gradient: never NaN, never the
// uniform row that filling with -1e6 (the textbook's trick) would give. Validation once at the entry.
#pragma once
#include <ATen/ATen.h>

namespace spanformer::ops {

// `valid` undefined: the plain softmax.
at::Tensor masked_softmax(const at::Tensor& scores, const at::Tensor& valid);
// The same rule for any bool keep-mask broadcastable to `scores` (key padding, causal, both): the
// one home of "a row with no key is zero".
at::Tensor softmax_where(const at::Tensor& scores, const at::Tensor& keep);
// The (B, N or 1, C) bool keep-mask of valid lengths (B) or (B, N), checked against B, N and C.
at::Tensor valid_length_mask(const at::Tensor& valid, int64_t B, int64_t N, int64_t C, const at::Device& device);

}  // namespace spanformer::ops
