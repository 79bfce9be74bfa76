// Reformer LSH attention (ops/lsh_attention.h has the formulas and the causal key rule).
#include "spanformer/ops/lsh_attention.h"

#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "op_autocast.h"
#include "spanformer/util/error.h"

namespace spanformer::ops {
namespace {

constexpr double kSelfScore = -1e9;  // the self score: weighs 0 beside any other key, 1 when alone

void check(const at::Tensor& q, const at::Tensor& v, const at::Tensor& rot, const LshOptions& o) {
  if (q.dim() != 4 || q.sizes() != v.sizes() || q.size(2) < 1)
    fail("lsh attention: q and v (B, K, N, D) of one shape expected (got {}, {})", fmt::join(q.sizes(), "x"),
         fmt::join(v.sizes(), "x"));
  if (rot.dim() != 4 || rot.size(0) != q.size(1) || rot.size(2) != q.size(3) || rot.size(1) < 1 || rot.size(3) < 1)
    fail("lsh attention: rotations (K, R, D, buckets / 2) expected (got {})", fmt::join(rot.sizes(), "x"));
  if (!q.is_floating_point())
    fail("lsh attention: q and v must be floating point, got {}", c10::toString(q.scalar_type()));
  if (v.scalar_type() != q.scalar_type() || rot.scalar_type() != q.scalar_type() || v.device() != q.device() ||
      rot.device() != q.device())
    fail("lsh attention: q, v and the rotations must share dtype and device");
  if (o.chunk < 1) fail("lsh attention: chunk must be >= 1, got {}", o.chunk);
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("lsh attention: dropout must be in [0, 1), got {}", o.dropout);
}

// Keys are the unit shared query/keys.
at::Tensor unit(const at::Tensor& q) { return q / q.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12); }

// Sorted order of every round: rank (B, K, R, N) = place of position i in the (bucket, position) order.
struct Order {
  at::Tensor buckets, perm, rank;  // (B, K, R, N) int64 each; perm[t] = position at sorted place t
};
Order sort_rounds(const at::Tensor& q, const at::Tensor& rot, int64_t buckets) {
  Order o;
  o.buckets = lsh_buckets(q, rot, buckets);
  const int64_t N = q.size(2);
  auto key = o.buckets * N + at::arange(N, o.buckets.options());  // (B, K, R, N), distinct per round
  o.perm = key.argsort(/*dim=*/static_cast<int64_t>(-1));
  o.rank = o.perm.argsort(/*dim=*/static_cast<int64_t>(-1));
  return o;
}

// Scores outside A_r(i) -> -inf, self -> kSelfScore. s (..., n, c); q*/k* broadcastable int64 tensors of
// the query's and key's bucket and sorted place.
at::Tensor mask_scores(const at::Tensor& s, const at::Tensor& qb, const at::Tensor& kb, const at::Tensor& qt,
                       const at::Tensor& kt, int64_t m) {
  auto allowed = (qb == kb) & (kt <= qt) & (qt - kt <= m);
  auto inf = at::full({}, -std::numeric_limits<double>::infinity(), s.options());
  return at::where(allowed, at::where(qt == kt, at::full({}, kSelfScore, s.options()), s), inf);
}

// out = sum_r e^{L_r - L} o_r: o (B, K, R, N, D), lse (B, K, R, N) -> (B, K, N, D).
at::Tensor combine_rounds(const at::Tensor& o, const at::Tensor& lse) {
  auto w = at::softmax(lse, 2);  // (B, K, R, N): e^{L_r - L}, shifted by the largest L_r (exact when all are -1e9)
  return (o * w.unsqueeze(-1)).sum(2);
}

}  // namespace

std::vector<int64_t> lsh_factors(int64_t buckets) {
  if (buckets < 2 || buckets % 2 != 0) fail("lsh attention: buckets must be even and >= 2 (got {})", buckets);
  if (buckets > 64)
    for (int64_t b1 = static_cast<int64_t>(std::sqrt(static_cast<double>(buckets))) / 2 * 2; b1 >= 2; b1 -= 2)
      if (buckets % b1 == 0 && (buckets / b1) % 2 == 0) return {b1, buckets / b1};
  return {buckets};
}

at::Tensor lsh_rotations(int64_t heads, int64_t rounds, int64_t head_dim, int64_t buckets, const at::TensorOptions& options) {
  int64_t columns = 0;
  for (int64_t b : lsh_factors(buckets)) columns += b / 2;
  return at::randn({heads, rounds, head_dim, columns}, options);
}

at::Tensor lsh_buckets(const at::Tensor& q, const at::Tensor& rot, int64_t buckets) {
  at::NoGradGuard no_grad;
  const auto factors = buckets > 0 ? lsh_factors(buckets) : std::vector<int64_t>{2 * rot.size(3)};
  int64_t columns = 0;
  for (int64_t b : factors) columns += b / 2;
  if (rot.size(3) != columns)
    fail("lsh attention: {} buckets need rotations with {} columns (got {})", buckets, columns, rot.size(3));
  auto x = at::einsum("bknd,krdh->bkrnh", {q.detach(), rot});  // (B, K, R, N, columns)
  at::Tensor result;                                            // (B, K, R, N)
  int64_t first = 0;
  for (int64_t b : factors) {  // b_r = ((b_r1) b2 + b_r2) ...: the first factor most significant
    auto part = x.narrow(-1, first, b / 2);
    auto digit = at::cat({part, -part}, -1).argmax(-1);
    result = result.defined() ? result * b + digit : digit;
    first += b / 2;
  }
  return result;
}

at::Tensor lsh_attention_reference(const at::Tensor& q_in, const at::Tensor& v_in, const at::Tensor& rot_in,
                                   const LshOptions& o) {
  const OpAutocast cast(q_in);  // train.amp: the op's own compute dtype (op_autocast.h)
  const auto q = cast(q_in), v = cast(v_in), rot = cast(rot_in);
  check(q, v, rot, o);
  const auto order = sort_rounds(q, rot, o.buckets);
  auto s = at::matmul(q, unit(q).transpose(-1, -2)).unsqueeze(2) / std::sqrt(static_cast<double>(q.size(3)));  // (B, K, 1, N, N)
  auto scores = mask_scores(s, order.buckets.unsqueeze(-1), order.buckets.unsqueeze(-2), order.rank.unsqueeze(-1),
                            order.rank.unsqueeze(-2), o.chunk);  // (B, K, R, N, N)
  auto lse = scores.logsumexp(-1);                               // (B, K, R, N)
  auto a = (scores - lse.unsqueeze(-1)).exp();                   // (B, K, R, N, N)
  if (o.training && o.dropout > 0) a = at::dropout(a, o.dropout, true);
  return combine_rounds(at::matmul(a, v.unsqueeze(2)), lse);    // (B, K, N, D)
}

at::Tensor lsh_attention(const at::Tensor& q_in, const at::Tensor& v_in, const at::Tensor& rot_in, const LshOptions& o) {
  const OpAutocast cast(q_in);
  const auto q = cast(q_in), v = cast(v_in), rot = cast(rot_in);
  check(q, v, rot, o);
  const int64_t B = q.size(0), K = q.size(1), N = q.size(2), D = q.size(3), R = rot.size(1), m = o.chunk;
  const int64_t nc = (N + m - 1) / m, Np = nc * m;
  const auto order = sort_rounds(q, rot, o.buckets);
  auto lopts = order.perm.options();
  // Sorted places [N, Np) hold a dummy position N (zero vectors, bucket -1) so that chunks are full.
  auto perm = at::cat({order.perm, at::full({B, K, R, Np - N}, N, lopts)}, -1);                 // (B, K, R, Np)
  auto bucket = at::cat({order.buckets, at::full({B, K, R, 1}, -1, lopts)}, -1).gather(3, perm);  // (B, K, R, Np)
  auto zero = at::zeros({B, K, 1, D}, q.options());
  auto gather_rows = [&](const at::Tensor& x) {  // (B, K, N, D) -> sorted (B, K, R, nc, m, D)
    auto ext = at::cat({x, zero}, 2).unsqueeze(2).expand({B, K, R, N + 1, D});
    return ext.gather(3, perm.unsqueeze(-1).expand({B, K, R, Np, D})).view({B, K, R, nc, m, D});
  };
  // Each chunk's keys: the chunk before it (none before chunk 0: bucket -2 never matches), then itself.
  auto look_back = [&](const at::Tensor& x, double fill) {  // (B, K, R, nc, m, ...) -> (B, K, R, nc, 2m, ...)
    auto first = at::full_like(x.narrow(3, 0, 1), fill);
    return at::cat({at::cat({first, x.narrow(3, 0, nc - 1)}, 3), x}, 4);
  };
  auto qc = gather_rows(q), kc = gather_rows(unit(q)), vc = gather_rows(v);   // (B, K, R, nc, m, D)
  auto qb = bucket.view({B, K, R, nc, m});                                      // (B, K, R, nc, m)
  auto qt = at::arange(Np, lopts).view({nc, m});                                // (nc, m) sorted places
  auto kb = look_back(qb, -2), kt = look_back(qt.view({1, 1, 1, nc, m}), -1e12).view({nc, 2 * m});  // (.., nc, 2m)
  auto s = at::matmul(qc, look_back(kc, 0).transpose(-1, -2)) / std::sqrt(static_cast<double>(D));  // (B, K, R, nc, m, 2m)
  auto scores = mask_scores(s, qb.unsqueeze(-1), kb.unsqueeze(-2), qt.unsqueeze(-1), kt.unsqueeze(-2), m);
  auto lse = scores.logsumexp(-1);                   // (B, K, R, nc, m)
  auto a = (scores - lse.unsqueeze(-1)).exp();       // (B, K, R, nc, m, 2m)
  if (o.training && o.dropout > 0) a = at::dropout(a, o.dropout, true);
  auto out = at::matmul(a, look_back(vc, 0));        // (B, K, R, nc, m, D)
  // Back to position order: position i sits at sorted place rank[i] (< N, real places come first).
  auto o_r = out.view({B, K, R, Np, D}).gather(3, order.rank.unsqueeze(-1).expand({B, K, R, N, D}));  // (B, K, R, N, D)
  auto l_r = lse.view({B, K, R, Np}).gather(3, order.rank);                                          // (B, K, R, N)
  return combine_rounds(o_r, l_r);
}

}  // namespace spanformer::ops
