// Reformer attention (Kitaev, Kaiser and Levskaya 2020, "Reformer: The Efficient Transformer", sec. 2):
// locality-sensitive hashing puts similar shared query/keys in the same bucket, and each query attends
// only among the keys of its bucket. The GPT family's `model.attention = lsh`.
//
// Shared QK: one projection gives q; the keys are the unit vectors k_j = q_j / |q_j|, so q_i . k_j is
// large exactly when q_i and q_j point the same way, and the hash of q and of k agree.
// Hash (angular LSH, sec. 2 eq. 3): for round r with a random rotation A_r (D, nb / 2), A ~ N(0, 1),
//     b_r(x) = argmax([x A_r ; -x A_r])   in {0 .. nb - 1}   (nb buckets, even)
// Many buckets are factorised, as the paper's reference implementation (trax) does when n_buckets is
// a list: beyond 64 buckets, nb = b1 b2 (both even, b1 the even divisor nearest below sqrt(nb) that
// leaves b2 even; lsh_factors) and two independent rotations A_r1 (D, b1 / 2), A_r2 (D, b2 / 2) give
//     b_r(x) = b_r1(x) b2 + b_r2(x)
// so hashing costs N D (b1 + b2) / 2 instead of N D nb / 2, which with nb ~ N / m was quadratic in N
// (at 32k positions and 512 buckets it took longer than the attention itself: docs/benchmarks.md).
// Per round: sort positions by (bucket, position), cut the sorted order into chunks of m, let each chunk
// attend to itself and the chunk before it. In a causal model that chunk rule alone would let a later
// token's bucket move the chunk boundaries seen by an earlier query (a leak of future information), so
// the keys are further masked to the query's own bucket and to at most m sorted places back: in round r
// query i reads
//     A_r(i) = { j <= i : b_r(j) = b_r(i), rank_r(i) - rank_r(j) <= m }
// = itself and the m most recent earlier positions of its bucket, which depends only on positions <= i
// (exactly causal; tests/test_lsh.cpp checks it) and still fits the chunk + previous chunk computation.
// No attention to self unless alone (sec. 2.2): the self score is replaced by -1e9, so it weighs exactly
// 0 when any other key is in A_r(i) and 1 when none is.
//     s_ij = q_i . k_j / sqrt(D),   L_r(i) = logsumexp_{j in A_r(i)} s_ij,   o_r(i) = sum_j e^{s_ij - L_r(i)} v_j
// Rounds combine by their normalisers (sec. 2.2, multi-round LSH):
//     out_i = sum_r e^{L_r(i) - L(i)} o_r(i),   L(i) = logsumexp_r L_r(i)
// (a key found in several rounds counts once per round, the paper's simple combination).
//
// Dims: B batch, K heads, N positions (self-attention, no cache: generation recomputes), D head width,
// R = n_hashes rounds, nb buckets, m chunk length, Np = N rounded up to m. Cost: O(R N m D) time and
// O(R N m) memory per layer against N^2 for dense. The fast path's backward is autograd's through
// gathers and chunk-sized products (no N x N tensor); the reference composition builds the whole
// (B, K, R, N, N) masked score tensor. tests/test_lsh.cpp holds them together in double precision.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace spanformer::ops {

struct LshOptions {
  int64_t chunk = 64;     // m
  int64_t buckets = 0;    // nb (0: 2 x the rotations' columns, one factor)
  double dropout = 0.0;   // on the attention weights, when training
  bool training = false;
};

// The factors of nb buckets: {nb} up to 64 buckets (or when nb is not a product of two even numbers),
// else {b1, b2} as above. Rotations hold sum(b_i / 2) columns.
std::vector<int64_t> lsh_factors(int64_t buckets);

// Random rotations for K heads and R rounds: (K, R, D, sum over factors b_i / 2) ~ N(0, 1) from the
// default generator.
at::Tensor lsh_rotations(int64_t heads, int64_t rounds, int64_t head_dim, int64_t buckets, const at::TensorOptions& options);

// b_r of every position: q (B, K, N, D), rotations from lsh_rotations(.., buckets, ..) -> (B, K, R, N)
// int64 in [0, buckets). buckets 0: 2 x the rotations' columns (one factor).
at::Tensor lsh_buckets(const at::Tensor& q, const at::Tensor& rotations, int64_t buckets = 0);

// q, v (B, K, N, D); rotations from lsh_rotations. Returns (B, K, N, D). Validates once.
at::Tensor lsh_attention(const at::Tensor& q, const at::Tensor& v, const at::Tensor& rotations, const LshOptions& o);
// The plain composition of the same formula (whole N x N per round; autograd).
at::Tensor lsh_attention_reference(const at::Tensor& q, const at::Tensor& v, const at::Tensor& rotations,
                                   const LshOptions& o);

}  // namespace spanformer::ops
