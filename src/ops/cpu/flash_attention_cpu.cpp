// CPU kernel of flash attention (include/spanformer/ops/flash_attention.h has the formulas): the `cpu` row
// of src/ops/backends.h. One pass forward and one backward over (query tile, key tile) pairs, no N x C
// tensor: a tile's scores, running maximum, exponentials and rescaling stay in per-thread buffers of
// the cache, and every product goes straight into its tile (tile_gemm.h: oneDNN's micro-kernel through
// ATen). The ATen tiles (flash_attention.cpp) are the same arithmetic as a composition of ATen ops,
// batched over heads; this file is what they become when the tile is the unit of work.
//
// Forward, per (x = b K + h, query tile Q_t of n rows) and key tiles K_u of c keys from the band's first
// key to the diagonal:
//   S = Qs K_u^T                      (n, c)   Qs = Q / sqrt(D), K^T of the head transposed once
//   m' = max(m, rowmax S);  P = exp(S - m') on each row's keys, 0 elsewhere;  l = l e^{m - m'} + rowsum P
//   acc = acc e^{m - m'} + (P Z) V_u  (n, D)
// then out = acc / l and L = m + log l (float32; float64 for float64 inputs).
//
// Backward, per head x (its key tiles' gradients have one owner), key tiles K_u outer and the query
// tiles that see them inner (FlashAttention-2's order), everything in the transposed orientation so
// that each product reads rows as they lie in memory:
//   S^T  = K_u Qs^T             (c, n)     P^T = exp(S^T - L) on each key's queries, 0 elsewhere
//   dP^T = V_u dO^T             (c, n)
//   dV_u += (P^T Z) dO_t        (c, D)     dP^T = dP^T Z
//   dS^T = P^T (dP^T - Dv)      (c, n)     Dv_i = dO_i . out_i
//   dK_u += dS^T Qs_t           (c, D)     (1/sqrt(D) through Qs)
//   dQ^T += K_u^T dS^T          (D, n)     scaled by 1/sqrt(D) and transposed once at the end
// Qs^T, dO^T and K^T are made once per head, each in blocks of one tile (transpose_blocks), so that a
// product reads a tile's transpose from contiguous memory.
//
// Dtypes: float32 and float64 are computed in their own precision. bfloat16 and float16 inputs meet the
// products in one of two ways (tile_gemm.h, half_products_native: native where the CPU has AMX or,
// for bfloat16, AVX512-BF16):
//   widened  q, k, v and dO widened to float32 once per head, every product in float32, each result
//            rounded once, as the CUDA kernels do;
//   native   the products take 16-bit operands with float32 accumulation: q, k, v, dO as they are, P
//            (and P Z) and dS rounded to 16 bits before the products that read them (FlashAttention's
//            own choice on GPUs), 1/sqrt(D) applied to the float32 scores and to dK instead of to Q.
// Either way the row statistics, the softmax, dropout's Z and every sum stay float32; the logsumexp is
// float32.
//
// Soft-capping (FlashOptions::softcap) caps each score of a row where the row reads its keys, before the
// row statistics, and keeps 1 - tanh^2 per tile for dS; sinks start each row's running maximum and sum
// at the head's sink term (flash_attention.h has the formulas; the op adds the sinks' gradient).
//
// Padded batches (FlashOptions::key_ranges): each head of batch row b is a problem of its own over the
// row's real tokens, read in place (head_shape: queries at positions [max(first_b, C - N), end_b), keys
// [first_b, end_b), dropout hashing the true positions); its padded queries get 0 and L = -inf, its
// padded positions no gradient. Nothing is copied, so a padded batch costs what its real tokens cost.
//
// Tiles: `tile` keys per key tile, min(tile, 64) queries per query tile (FlashOptions::tile; the tests
// use tiles of 6 to 128 to reach every edge), both starting at multiples of their size. Key tiles of 64 to
// 1024 measured within 4% of each other at T 4k (2-core AMD EPYC, Zen 4; 256 fastest); query tiles of
// 32, 64 and 128 within 3%. Forward items are (head, query tile), the longest rows first; backward items
// are heads.
//
// Versions (docs/kernels.md has the measurements; 2-core AMD EPYC, Zen 4, 2 threads, fwd + bwd, B 1 K 8
// D 64 causal, T 4k):
//   v1  products by tile_gemm into per-thread tiles, rows by row_math.h: 351 ms (SDPA 460).
//   v2  (this file) the transposes in blocks of one tile (a tile's rows were N floats apart): 332 ms.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "../backends.h"
#include "../dropout_hash.h"
#include "row_math.h"
#include "tile_gemm.h"
#include "work_queue.h"

namespace spanformer::ops::cpu {
namespace {

constexpr int64_t kMaxQueryTile = 64;

// float64 stays float64; everything else is computed in float32.
template <typename scalar_t>
using acc_type = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

struct FlashShape {
  int64_t B, K, N, C, D, band, offset;  // offset = C - N: the key position of query 0
  int64_t q_tile, k_tile;
  int64_t pos0 = 0;  // the position of key 0 (a padded batch's head: its first real key; head_shape)
  int64_t X() const { return B * K; }
  // The keys query i reads: [first_key(i), C - N + i].
  int64_t first_key(int64_t i) const { return std::max<int64_t>(0, offset + i - band + 1); }
};

// Tiles no larger than the sequence (the per-thread buffers are tile-sized; a tile of 10^9 is a whole head).
FlashShape flash_shape_of(const at::Tensor& q, const at::Tensor& k, const FlashOptions& o) {
  const int64_t N = q.size(2), C = k.size(2), tile = std::max<int64_t>(1, o.tile);
  return {q.size(0), q.size(1), N, C, q.size(3), o.band, C - N, std::min({tile, kMaxQueryTile, N}), std::min(tile, C)};
}

// Z = keep / (1 - p) of query i (position p_i) and key j, or 1 without dropout.
struct FlashDropout {
  const FlashOptions& o;
  bool on() const { return o.training && o.dropout > 0; }
  template <typename T>
  T factor(int64_t x, const FlashShape& s, int64_t i, int64_t j) const {
    return dropout_keep_hash(o.seed, x / s.K, x % s.K, s.pos0 + s.offset + i, s.pos0 + j, o.dropout)
               ? T(1.0 / (1.0 - o.dropout))
               : T(0);
  }
};

// Padded batches (FlashOptions::key_ranges): each batch row's [first, end), (B, 2) flattened; empty = none.
std::vector<int64_t> key_ranges_of(const FlashOptions& o) {
  if (!o.key_ranges.defined()) return {};
  const auto r = o.key_ranges.to(at::kCPU, at::kLong).contiguous();  // (B, 2)
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

// The problem head x computes: the whole head, or in a padded batch its row's real tokens as a problem of
// their own, read in place: queries [q0, q0 + N) at positions [max(first, C - N), end) over keys
// [first, end) (pos0 = first, so dropout hashes the same positions). N = 0: the head has no real query.
// The tiles stay the whole problem's sizes (the scratch is sized by it).
FlashShape head_shape(const FlashShape& sh, const std::vector<int64_t>& ranges, int64_t x, int64_t& q0) {
  q0 = 0;
  if (ranges.empty()) return sh;
  const int64_t b = x / sh.K, first = ranges[2 * b], end = ranges[2 * b + 1], p0 = std::max(first, sh.offset);
  FlashShape h = sh;
  h.pos0 = first;
  h.C = end - first;
  h.N = std::max<int64_t>(0, end - p0);
  h.offset = h.C - h.N;
  q0 = h.N > 0 ? p0 - sh.offset : 0;
  return h;
}

// rows x cols of src (row stride ld_src) into dst (rows, cols) in dst_t, times `mul` (1: a plain copy).
template <typename scalar_t, typename dst_t, typename mul_t>
void widen_rows(const scalar_t* src, int64_t ld_src, int64_t rows, int64_t cols, mul_t mul, dst_t* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[r * cols + c] = static_cast<dst_t>(static_cast<mul_t>(src[r * ld_src + c]) * mul);
}

// n values of a float32 tile row as product operands (16-bit: rounded to nearest even).
template <typename op_t, typename acc_t>
inline void to_operands(const acc_t* src, int64_t n, op_t* dst) {
  for (int64_t c = 0; c < n; ++c) dst[c] = static_cast<op_t>(src[c]);
}

// The transpose of src (rows, D) in blocks of b rows: block t = rows [t b, t b + b) as a (D, b) matrix
// (row stride b) at dst + t D b, in dst_t, times `mul`. A product then reads a tile's transpose from one
// contiguous 4-64 KB block: with the whole (D, rows) transpose its rows would lie N floats apart, a
// multiple of 4 KB for the usual lengths, all in the same L1 cache sets.
template <typename scalar_t, typename dst_t, typename mul_t>
void transpose_blocks(const scalar_t* src, int64_t rows, int64_t D, int64_t b, mul_t mul, dst_t* dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += b) {
    dst_t* block = dst + (r0 / b) * D * b;
    const int64_t n = std::min(b, rows - r0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < D; ++d)
        block[d * b + r] = static_cast<dst_t>(static_cast<mul_t>(src[(r0 + r) * D + d]) * mul);
  }
}

// Room for the blocks of rows rows: whole blocks.
inline int64_t blocked_size(int64_t rows, int64_t D, int64_t b) { return (rows + b - 1) / b * b * D; }

// ---- forward -----------------------------------------------------------------------------------------

// op_t: the products' operand type (acc_t, or the 16-bit input type when the products are native).
template <typename acc_t, typename op_t>
struct ForwardScratch {
  std::vector<op_t> qs, p;               // (n, D) Q_t (scaled when widened), (n, c) P Z as operands (native)
  std::vector<acc_t> s, acc, m, l;       // (n, c), (n, D), (n), (n)
  explicit ForwardScratch(const FlashShape& sh)
      : qs(sh.q_tile * sh.D), p(std::is_same_v<op_t, acc_t> ? 0 : sh.q_tile * sh.k_tile), s(sh.q_tile * sh.k_tile),
        acc(sh.q_tile * sh.D), m(sh.q_tile), l(sh.q_tile) {}
};

// One query tile [i0, i0 + n) of head x. kT holds the head's K^T in blocks of k_tile keys
// (transpose_blocks), vrows (C, D) its values, both as operands. Key tiles start at multiples of k_tile.
// krows, vin: the head's keys and values (C, D) as they lie in the inputs, for one query (n = 1, a
// decoding step), in place of kT and vrows: the scores are then dot products of each key with q and
// the output the sum p_j v_j row by row (row_math.h's dot and add_scaled, each 16-bit value widened
// where it is read when the products are widened), so that no product packs, transposes or widens the
// cache for one row.
// sinks: each head's sink logit (K), or null; softcap: drop.o.softcap (0 = none).
template <typename scalar_t, typename acc_t, typename op_t>
void forward_tile(const FlashShape& sh, const FlashDropout& drop, const double* sinks, int64_t x, int64_t i0, int64_t n,
                  const scalar_t* q, const op_t* kT, const op_t* vrows, const scalar_t* krows, const scalar_t* vin,
                  scalar_t* out, acc_t* lse,
                  ForwardScratch<acc_t, op_t>& w) {
  constexpr bool native = !std::is_same_v<op_t, acc_t>;
  const int64_t D = sh.D;
  const acc_t scale = acc_t(1) / std::sqrt(acc_t(D));
  const acc_t pre = native ? acc_t(1) : scale, post = native ? scale : acc_t(1);  // where 1/sqrt(D) goes
  widen_rows(q + i0 * D, D, n, D, pre, w.qs.data());                               // (n, D) = Q_t pre
  std::fill(w.acc.begin(), w.acc.begin() + n * D, acc_t(0));
  // The running maximum and sum: empty, or the sink's own term e^{sigma - sigma} = 1.
  std::fill(w.m.begin(), w.m.begin() + n, sinks ? acc_t(sinks[x % sh.K]) : -std::numeric_limits<acc_t>::infinity());
  std::fill(w.l.begin(), w.l.begin() + n, sinks ? acc_t(1) : acc_t(0));
  const acc_t softcap = static_cast<acc_t>(drop.o.softcap);
  const int64_t lo = sh.first_key(i0), hi = sh.offset + i0 + n;                    // keys [lo, hi)
  for (int64_t j0 = lo / sh.k_tile * sh.k_tile; j0 < hi; j0 += sh.k_tile) {
    const int64_t c = std::min(sh.k_tile, hi - j0);
    acc_t* S = w.s.data();                                                         // (n, c), ld k_tile
    if (krows) {  // one query: each score a dot product of a key with q, the keys read in place
      for (int64_t j = 0; j < c; ++j) S[j] = rows::dot(krows + (j0 + j) * D, w.qs.data(), D);
    } else {
      const op_t* kT_u = kT + (j0 / sh.k_tile) * D * sh.k_tile;                    // (D, c), ld k_tile
      tile_gemm(n, c, D, w.qs.data(), D, kT_u, sh.k_tile, S, sh.k_tile, /*accumulate=*/false);
    }
    for (int64_t r = 0; r < n; ++r) {
      acc_t* row = S + r * sh.k_tile;
      const int64_t i = i0 + r;
      const int64_t a = std::max(sh.first_key(i), j0) - j0, b = std::min(sh.offset + i + 1, j0 + c) - j0;  // [a, b)
      if (a >= b) {  // none of this row's keys in the tile
        std::fill(row, row + c, acc_t(0));
        if constexpr (native) to_operands(row, c, w.p.data() + r * sh.k_tile);
        continue;
      }
      if (post != acc_t(1)) rows::scale(row + a, b - a, post);
      if (softcap > 0)
        for (int64_t col = a; col < b; ++col) row[col] = softcap * std::tanh(row[col] / softcap);
      const acc_t m_new = std::max(w.m[r], rows::max_of(row + a, b - a));
      const acc_t alpha = std::exp(w.m[r] - m_new);                                // 0 on the row's first tile
      std::fill(row, row + a, acc_t(0));
      std::fill(row + b, row + c, acc_t(0));
      w.l[r] = w.l[r] * alpha + rows::exp_shifted_sum(row + a, b - a, m_new);
      w.m[r] = m_new;
      if (drop.on())
        for (int64_t col = a; col < b; ++col) row[col] *= drop.factor<acc_t>(x, sh, i, j0 + col);
      if (alpha != acc_t(1)) rows::scale(w.acc.data() + r * D, D, alpha);
      if constexpr (native) to_operands(row, c, w.p.data() + r * sh.k_tile);      // P Z rounded to 16 bits
    }
    const op_t* P;                                                                 // (n, c), ld k_tile
    if constexpr (native) P = w.p.data(); else P = S;
    if (krows) {  // one query: acc += p_j v_j, each value row read in place (no packing of the cache)
      for (int64_t j = 0; j < c; ++j)
        if (P[j] != op_t(0)) rows::add_scaled(w.acc.data(), vin + (j0 + j) * D, D, static_cast<acc_t>(P[j]));
    } else {
      tile_gemm(n, D, c, P, sh.k_tile, vrows + j0 * D, D, w.acc.data(), D, /*accumulate=*/true);  // (n, D) += (P Z) V_u
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    const acc_t inv = acc_t(1) / w.l[r];
    for (int64_t d = 0; d < D; ++d) out[(i0 + r) * D + d] = static_cast<scalar_t>(w.acc[r * D + d] * inv);
    lse[i0 + r] = w.m[r] + std::log(w.l[r]);
  }
}

// Keys or values (B, K, C, D) read in place where each head's C rows are contiguous and the heads evenly
// spaced (a KV cache's view of a longer buffer: head stride >= C D); else a contiguous copy. The tensor
// to read and its head stride in elements.
std::pair<at::Tensor, int64_t> heads_of(const at::Tensor& t) {
  const int64_t B = t.size(0), K = t.size(1), C = t.size(2), D = t.size(3);
  const bool rows = (t.stride(3) == 1 || D == 1) && (t.stride(2) == D || C == 1);
  const int64_t hs = K > 1 ? t.stride(1) : B > 1 ? t.stride(0) : C * D;
  if (rows && hs >= C * D && (B == 1 || t.stride(0) == K * hs)) return {t, hs};
  return {t.contiguous(), C * D};
}

template <typename scalar_t, typename op_t>
Forward forward_impl(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const FlashOptions& o) {
  using acc_t = acc_type<scalar_t>;
  constexpr bool copy_v = !std::is_same_v<scalar_t, op_t>;  // widened 16-bit values
  const FlashShape sh = flash_shape_of(q_in, k_in, o);
  const int64_t X = sh.X(), N = sh.N, C = sh.C, D = sh.D;
  const auto q = q_in.contiguous();
  const auto k_heads = heads_of(k_in), v_heads = heads_of(v_in);
  const at::Tensor &k = k_heads.first, &v = v_heads.first;
  const int64_t hk = k_heads.second, hv = v_heads.second;  // head x's keys at k + x hk, values at v + x hv
  const auto acc_dtype = c10::CppTypeToScalarType<acc_t>::value, op_dtype = c10::CppTypeToScalarType<op_t>::value;
  auto out = at::empty_like(q);                                                    // (B, K, N, D)
  auto lse = at::empty({sh.B, sh.K, N}, q.options().dtype(acc_dtype));             // (B, K, N)
  // Per head: K^T in blocks of k_tile keys, and the values as operands (a float32 copy when widened).
  // One query a head (a decoding step) reads the keys and values as they lie instead: the transpose and
  // the copy would read and write the whole cache for one row of scores.
  const bool one_query = N == 1;
  const int64_t kT_size = one_query ? 0 : blocked_size(C, D, sh.k_tile);
  auto kT = at::empty({X, kT_size}, q.options().dtype(op_dtype));                  // (X, C / k_tile, D, k_tile)
  auto vw = copy_v ? at::empty({one_query ? 0 : X, C, D}, q.options().dtype(op_dtype)) : v;  // (X, C, D)
  const scalar_t* kp = k.template data_ptr<scalar_t>();
  const scalar_t* vp = v.template data_ptr<scalar_t>();
  op_t* kTp = kT.template data_ptr<op_t>();
  const std::vector<int64_t> ranges = key_ranges_of(o);
  scalar_t* op = out.template data_ptr<scalar_t>();
  acc_t* lp = lse.template data_ptr<acc_t>();
  for_each_item(X, [&](int64_t x) {
    int64_t q0;
    const FlashShape h = head_shape(sh, ranges, x, q0);
    if (!one_query) transpose_blocks(kp + x * hk + h.pos0 * D, h.C, D, sh.k_tile, acc_t(1), kTp + x * kT_size);
    if (copy_v && !one_query)
      widen_rows(vp + x * hv + h.pos0 * D, D, h.C, D, acc_t(1), vw.template data_ptr<op_t>() + x * C * D);
    // A padded query: output 0, L = -inf.
    for (const auto& [i, n] : {std::pair{int64_t(0), q0}, std::pair{q0 + h.N, N - q0 - h.N}}) {
      std::fill(op + (x * N + i) * D, op + (x * N + i + n) * D, scalar_t(0));
      std::fill(lp + x * N + i, lp + x * N + i + n, -std::numeric_limits<acc_t>::infinity());
    }
  });
  // Items (head, query tile), the tiles with the most keys first.
  struct Item {
    int64_t x, q0, keys;
    FlashShape sh;
    int64_t i0;
  };
  std::vector<Item> items;
  for (int64_t x = 0; x < X; ++x) {
    int64_t q0;
    const FlashShape h = head_shape(sh, ranges, x, q0);
    for (int64_t i0 = 0; i0 < h.N; i0 += sh.q_tile)
      items.push_back({x, q0, h.offset + i0 + std::min(sh.q_tile, h.N - i0) - h.first_key(i0), h, i0});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.keys > b.keys; });
  const FlashDropout drop{o};
  std::vector<double> sink_values;  // (K)
  if (o.sinks.defined()) {
    const auto s64 = o.sinks.to(at::kDouble).contiguous();
    sink_values.assign(s64.data_ptr<double>(), s64.data_ptr<double>() + s64.numel());
  }
  const double* sinks = sink_values.empty() ? nullptr : sink_values.data();
  const scalar_t* qp = q.template data_ptr<scalar_t>();
  const op_t* vwp = vw.template data_ptr<op_t>();
  for_each_item(
      static_cast<int64_t>(items.size()), [&] { return ForwardScratch<acc_t, op_t>(sh); },
      [&](int64_t j, ForwardScratch<acc_t, op_t>& w) {
        const Item& it = items[static_cast<size_t>(j)];
        const int64_t x = it.x, row0 = x * N + it.q0;  // the head's first real query
        const op_t* vrows = one_query ? nullptr : copy_v ? vwp + x * C * D : vwp + x * hv + it.sh.pos0 * D;
        const scalar_t* krows = one_query ? kp + x * hk + it.sh.pos0 * D : nullptr;
        const scalar_t* vin = one_query ? vp + x * hv + it.sh.pos0 * D : nullptr;
        forward_tile<scalar_t, acc_t, op_t>(it.sh, drop, sinks, x, it.i0, std::min(sh.q_tile, it.sh.N - it.i0),
                                            qp + row0 * D, kTp + x * kT_size, vrows, krows, vin, op + row0 * D, lp + row0,
                                            w);
        if constexpr (!std::is_same_v<op_t, acc_t>) release_half_products(op_dtype);
      });
  return {out, lse};
}

// ---- backward ----------------------------------------------------------------------------------------

template <typename acc_t, typename op_t>
struct BackwardScratch {
  std::vector<op_t> qs, qsT, dO, dOT, kr, kT, vr;  // per head, as operands; the ...T in blocks
  std::vector<acc_t> dQT, lse, delta;              // per head
  std::vector<acc_t> pT, dpT, pz, dK, dV;          // per tile
  std::vector<op_t> pz_op, ds_op;                  // per tile: P^T Z and dS^T as 16-bit operands (native)
  std::vector<acc_t> cap;                          // per tile with softcap: 1 - tanh^2 of the scores (c, n)
  explicit BackwardScratch(const FlashShape& sh)
      : qs(sh.N * sh.D), qsT(blocked_size(sh.N, sh.D, sh.q_tile)), dO(sh.N * sh.D),
        dOT(blocked_size(sh.N, sh.D, sh.q_tile)), kr(sh.C * sh.D), kT(blocked_size(sh.C, sh.D, sh.k_tile)),
        vr(sh.C * sh.D), dQT(blocked_size(sh.N, sh.D, sh.q_tile)), lse(sh.N), delta(sh.N), pT(sh.k_tile * sh.q_tile),
        dpT(sh.k_tile * sh.q_tile), pz(sh.k_tile * sh.q_tile), dK(sh.k_tile * sh.D), dV(sh.k_tile * sh.D),
        pz_op(std::is_same_v<op_t, acc_t> ? 0 : sh.k_tile * sh.q_tile),
        ds_op(std::is_same_v<op_t, acc_t> ? 0 : sh.k_tile * sh.q_tile), cap(sh.k_tile * sh.q_tile) {}
};

template <typename scalar_t, typename acc_t, typename op_t>
void backward_head(const FlashShape& sh, const FlashDropout& drop, int64_t x, const scalar_t* dout, const scalar_t* q,
                   const scalar_t* k, const scalar_t* v, const scalar_t* out, const acc_t* lse, scalar_t* dq,
                   scalar_t* dk, scalar_t* dv, BackwardScratch<acc_t, op_t>& w) {
  constexpr bool native = !std::is_same_v<op_t, acc_t>;
  const int64_t N = sh.N, C = sh.C, D = sh.D, bq = sh.q_tile, bk = sh.k_tile;
  const acc_t scale = acc_t(1) / std::sqrt(acc_t(D));
  const acc_t pre = native ? acc_t(1) : scale, post = native ? scale : acc_t(1);  // where 1/sqrt(D) goes
  const acc_t softcap = static_cast<acc_t>(drop.o.softcap);
  widen_rows(q, D, N, D, pre, w.qs.data());                                        // (N, D) = Q pre
  transpose_blocks(q, N, D, bq, pre, w.qsT.data());                                // (N / bq, D, bq)
  widen_rows(dout, D, N, D, acc_t(1), w.dO.data());                                // (N, D)
  transpose_blocks(dout, N, D, bq, acc_t(1), w.dOT.data());                        // (N / bq, D, bq)
  widen_rows(k, D, C, D, acc_t(1), w.kr.data());                                   // (C, D)
  transpose_blocks(k, C, D, bk, acc_t(1), w.kT.data());                            // (C / bk, D, bk)
  widen_rows(v, D, C, D, acc_t(1), w.vr.data());                                   // (C, D)
  for (int64_t i = 0; i < N; ++i) {                                                // Dv_i = dO_i . out_i
    acc_t o_row[256], g_row[256];
    acc_t total = 0;
    for (int64_t d0 = 0; d0 < D; d0 += 256) {
      const int64_t m = std::min<int64_t>(256, D - d0);
      for (int64_t d = 0; d < m; ++d) {
        o_row[d] = static_cast<acc_t>(out[i * D + d0 + d]);
        g_row[d] = static_cast<acc_t>(dout[i * D + d0 + d]);
      }
      total += rows::dot(g_row, o_row, m);
    }
    w.delta[i] = total;
    w.lse[i] = lse[i];
  }
  std::fill(w.dQT.begin(), w.dQT.end(), acc_t(0));
  for (int64_t j0 = 0; j0 < C; j0 += bk) {
    const int64_t c = std::min(bk, C - j0);
    // The queries that read a key of [j0, j0 + c): positions p with j0 <= p <= j0 + c - 1 + band - 1.
    const int64_t i_lo = std::max<int64_t>(0, j0 - sh.offset);
    const int64_t i_hi = std::min<int64_t>(N, j0 + c - 1 + sh.band - sh.offset);  // exclusive
    std::fill(w.dK.begin(), w.dK.begin() + c * D, acc_t(0));
    std::fill(w.dV.begin(), w.dV.begin() + c * D, acc_t(0));
    for (int64_t i0 = i_lo / bq * bq; i0 < i_hi; i0 += bq) {  // query tiles at multiples of bq
      const int64_t n = std::min(bq, i_hi - i0);
      const op_t* qsT_t = w.qsT.data() + (i0 / bq) * D * bq;                       // (D, n), ld bq
      const op_t* dOT_t = w.dOT.data() + (i0 / bq) * D * bq;                       // (D, n), ld bq
      acc_t* dQT_t = w.dQT.data() + (i0 / bq) * D * bq;                            // (D, n), ld bq
      acc_t* pT = w.pT.data();                                                     // (c, n), ld bq
      acc_t* dpT = w.dpT.data();                                                   // (c, n), ld bq
      tile_gemm(c, n, D, w.kr.data() + j0 * D, D, qsT_t, bq, pT, bq, false);       // S^T = K_u Qs^T
      tile_gemm(c, n, D, w.vr.data() + j0 * D, D, dOT_t, bq, dpT, bq, false);      // dP^T = V_u dO^T
      for (int64_t cc = 0; cc < c; ++cc) {
        const int64_t j = j0 + cc;
        // Key j is read by the queries at positions [j, j + band - 1]: rows [a, b) of the tile.
        const int64_t a = std::clamp<int64_t>(j - sh.offset - i0, 0, n);
        const int64_t b = std::clamp<int64_t>(j + sh.band - sh.offset - i0, 0, n);
        acc_t* prow = pT + cc * bq;
        std::fill(prow, prow + a, acc_t(0));
        std::fill(prow + std::max(a, b), prow + n, acc_t(0));
        if (a < b && post != acc_t(1)) rows::scale(prow + a, b - a, post);
        if (a < b && softcap > 0)
          for (int64_t r = a; r < b; ++r) {
            const acc_t t = std::tanh(prow[r] / softcap);
            prow[r] = softcap * t;
            w.cap[cc * bq + r] = acc_t(1) - t * t;
          }
        if (a < b) rows::exp_minus(prow + a, w.lse.data() + i0 + a, b - a);
      }
      const acc_t* p_for_v = pT;
      if (drop.on()) {  // dV takes P Z; dP^T = dP^T Z
        for (int64_t cc = 0; cc < c; ++cc)
          for (int64_t r = 0; r < n; ++r) {
            const acc_t z = drop.factor<acc_t>(x, sh, i0 + r, j0 + cc);
            w.pz[cc * bq + r] = pT[cc * bq + r] * z;
            dpT[cc * bq + r] *= z;
          }
        p_for_v = w.pz.data();
      }
      if constexpr (native) {  // (P Z)^T rounded to 16 bits, before pT turns into dS^T
        for (int64_t cc = 0; cc < c; ++cc) to_operands(p_for_v + cc * bq, n, w.pz_op.data() + cc * bq);
        tile_gemm(c, D, n, w.pz_op.data(), bq, w.dO.data() + i0 * D, D, w.dV.data(), D, true);  // dV_u += (P Z)^T dO_t
      } else {
        tile_gemm(c, D, n, p_for_v, bq, w.dO.data() + i0 * D, D, w.dV.data(), D, true);          // dV_u += (P Z)^T dO_t
      }
      for (int64_t cc = 0; cc < c; ++cc) {                                         // dS^T = P^T (dP^T - Dv)
        rows::times_difference(pT + cc * bq, dpT + cc * bq, w.delta.data() + i0, n);
        if (softcap > 0) {  // through the cap: the rows outside [a, b) are 0 already
          const int64_t j = j0 + cc;
          const int64_t a = std::clamp<int64_t>(j - sh.offset - i0, 0, n);
          const int64_t b = std::clamp<int64_t>(j + sh.band - sh.offset - i0, 0, n);
          for (int64_t r = a; r < b; ++r) pT[cc * bq + r] *= w.cap[cc * bq + r];
        }
        if constexpr (native) to_operands(pT + cc * bq, n, w.ds_op.data() + cc * bq);  // dS^T rounded to 16 bits
      }
      const op_t* dsT;                                                             // (c, n), ld bq
      if constexpr (native) dsT = w.ds_op.data(); else dsT = pT;
      tile_gemm(c, D, n, dsT, bq, w.qs.data() + i0 * D, D, w.dK.data(), D, true);        // dK_u += dS^T Qs_t
      tile_gemm(D, n, c, w.kT.data() + (j0 / bk) * D * bk, bk, dsT, bq, dQT_t, bq, true);  // dQ^T += K_u^T dS^T
    }
    for (int64_t e = 0; e < c * D; ++e) {
      dk[j0 * D + e] = static_cast<scalar_t>(w.dK[e] * post);
      dv[j0 * D + e] = static_cast<scalar_t>(w.dV[e]);
    }
  }
  for (int64_t i = 0; i < N; ++i) {                                                // dQ = (dQ^T)^T / sqrt(D)
    const acc_t* block = w.dQT.data() + (i / bq) * D * bq + i % bq;
    for (int64_t d = 0; d < D; ++d) dq[i * D + d] = static_cast<scalar_t>(block[d * bq] * scale);
  }
}

template <typename scalar_t, typename op_t>
FlashGrads backward_impl(const at::Tensor& grad_out, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                    const at::Tensor& out_in, const at::Tensor& lse_in, const FlashOptions& o) {
  using acc_t = acc_type<scalar_t>;
  const FlashShape sh = flash_shape_of(q_in, k_in, o);
  const int64_t N = sh.N, C = sh.C, D = sh.D;
  const auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), out = out_in.contiguous();
  const auto dout = grad_out.contiguous();
  const auto lse = lse_in.to(c10::CppTypeToScalarType<acc_t>::value).contiguous();  // (B, K, N)
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const FlashDropout drop{o};
  const scalar_t *qp = q.template data_ptr<scalar_t>(), *kp = k.template data_ptr<scalar_t>(), *vp = v.template data_ptr<scalar_t>();
  const scalar_t *op = out.template data_ptr<scalar_t>(), *gp = dout.template data_ptr<scalar_t>();
  const acc_t* lp = lse.template data_ptr<acc_t>();
  scalar_t *dqp = dq.template data_ptr<scalar_t>(), *dkp = dk.template data_ptr<scalar_t>(), *dvp = dv.template data_ptr<scalar_t>();
  const std::vector<int64_t> ranges = key_ranges_of(o);
  for_each_item(
      sh.X(), [&] { return BackwardScratch<acc_t, op_t>(sh); },
      [&](int64_t x, BackwardScratch<acc_t, op_t>& w) {
        int64_t q0;
        const FlashShape h = head_shape(sh, ranges, x, q0);
        const int64_t row0 = x * N + q0, key0 = x * C + h.pos0;  // the head's first real query and key
        // Padded queries and keys: gradient 0.
        std::fill(dqp + x * N * D, dqp + row0 * D, scalar_t(0));
        std::fill(dqp + (row0 + h.N) * D, dqp + (x + 1) * N * D, scalar_t(0));
        const int64_t kept = h.N > 0 ? h.C : 0;
        for (scalar_t* g : {dkp, dvp}) {
          std::fill(g + x * C * D, g + key0 * D, scalar_t(0));
          std::fill(g + (key0 + kept) * D, g + (x + 1) * C * D, scalar_t(0));
        }
        if (h.N == 0) return;
        backward_head<scalar_t, acc_t, op_t>(h, drop, x, gp + row0 * D, qp + row0 * D, kp + key0 * D, vp + key0 * D,
                                             op + row0 * D, lp + row0, dqp + row0 * D, dkp + key0 * D,
                                             dvp + key0 * D, w);
        if constexpr (!std::is_same_v<op_t, acc_t>) release_half_products(c10::CppTypeToScalarType<op_t>::value);
      });
  return {dq, dk, dv};
}

// The operand type of the products for scalar_t: the input type itself when 16-bit products are native
// (tile_gemm.h), acc_type otherwise.
template <typename scalar_t, typename F>
void with_operands(F&& f) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> || std::is_same_v<scalar_t, c10::Half>) {
    if (half_products_native(c10::CppTypeToScalarType<scalar_t>::value)) {
      f(scalar_t{});
      return;
    }
  }
  f(acc_type<scalar_t>{});
}

}  // namespace

bool flash_supported(const at::Tensor& q) {
  const auto t = q.scalar_type();
  return q.device().is_cpu() && (t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf);
}

Forward flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o) {
  Forward f;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "flash_forward_cpu", [&] {
    with_operands<scalar_t>([&](auto op) { f = forward_impl<scalar_t, decltype(op)>(q, k, v, o); });
  });
  return f;
}

FlashGrads flash_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const FlashOptions& o) {
  FlashGrads g;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "flash_backward_cpu", [&] {
    with_operands<scalar_t>([&](auto op) { g = backward_impl<scalar_t, decltype(op)>(grad_out, q, k, v, out, lse, o); });
  });
  return g;
}

}  // namespace spanformer::ops::cpu
