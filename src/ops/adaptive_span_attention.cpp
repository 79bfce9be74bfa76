// The adaptive-span attention operators and their entry point: argument checks once, then one backend row
// (src/ops/backends.h): the CPU kernel (fused, hand-written backward), the CUDA kernels, or the reference
// composition for other devices. Registered with torch.library as `spanformer::adaptive_span_attention`
// (Python: torch.ops.spanformer.adaptive_span_attention) with one autograd function over private
// forward / backward operators that have Meta kernels, so torch.compile(fullgraph=True) traces a model
// that calls it without a graph break; the C++ entry point calls the same operator.
#include <iterator>

#include "op_autocast.h"
#include "spanformer/ops/adaptive_span_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/ranges.h>

#include "spanformer/ops/skew.h"
#include "spanformer/util/error.h"
#include "spanformer/util/torch_compat.h"
#include "autograd_function.h"
#include "backends.h"
#include "cpu/tile_gemm.h"
#include "dropout_hash.h"

namespace spanformer::ops {

int64_t visited_distance(double z, double ramp, int64_t window) {
  // The mask reaches 0 at floor(z + R) + 1; clamped in double first, so that a span far outside [0, L]
  // (a damaged or foreign weight file: found by fuzzing) converts to an integer without overflow.
  const double last = std::floor(z + ramp) + 1;
  if (!(last < static_cast<double>(window))) return window;  // NaN included
  return std::max<int64_t>(1, static_cast<int64_t>(std::max(last, 1.0)));
}

std::vector<int64_t> visited_distances(const at::Tensor& span_ratio, int64_t attn_span, double ramp, int64_t window) {
  auto z = span_ratio.detach().to(at::kCPU, at::kDouble) * static_cast<double>(attn_span);
  std::vector<int64_t> visited;
  for (int64_t h = 0; h < z.size(0); ++h) visited.push_back(visited_distance(z[h].item<double>(), ramp, window));
  return visited;
}

bool dropout_keep(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t d, double p) {
  return dropout_keep_hash(seed, b, h, i, d, p);
}

namespace {

// The visited distances of each head: from the options when the caller knows them, else read.
std::vector<int64_t> resolve_visited(const at::Tensor& span_ratio, int64_t W, const SpanAttentionOptions& o) {
  if (o.visited.empty()) return visited_distances(span_ratio, o.attn_span, o.ramp, W);
  TORCH_CHECK(static_cast<int64_t>(o.visited.size()) == span_ratio.size(0), "adaptive_span_attention: one visited count per head");
  for (int64_t s : o.visited) TORCH_CHECK(s >= 1 && s <= W, "adaptive_span_attention: visited count ", s, " outside [1, ", W, "]");
  return o.visited;
}

void check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                     const at::Tensor& span_ratio, const SpanAttentionOptions& o) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "adaptive_span_attention: q, k, v must be (B, K, T, D)");
  const int64_t B = q.size(0), K = q.size(1), M = q.size(2), D = q.size(3);
  TORCH_CHECK(!(k.sizes().slice(0, 3) == v.sizes().slice(0, 3) && v.size(3) != k.size(3)),
              "adaptive_span_attention: v's head width ", v.size(3), " differs from k's ", k.size(3),
              ": the op takes one head width D for q, k and v");
  TORCH_CHECK(k.sizes() == v.sizes(), "adaptive_span_attention: k and v shapes differ");
  TORCH_CHECK(k.size(0) == B && k.size(1) == K && k.size(3) == D, "adaptive_span_attention: k does not match q");
  const int64_t W = k.size(2) - M;
  TORCH_CHECK(W >= 1 && W <= o.attn_span, "adaptive_span_attention: window ", W, " outside [1, L=", o.attn_span, "]");
  TORCH_CHECK(key_pe.dim() == 2 && key_pe.size(0) == D && key_pe.size(1) == o.attn_span,
              "adaptive_span_attention: key_pe must be (D, L)");
  TORCH_CHECK(span_ratio.dim() == 1 && span_ratio.size(0) == K, "adaptive_span_attention: span_ratio must be (K)");
  TORCH_CHECK(o.ramp > 0, "adaptive_span_attention: ramp must be positive");
  TORCH_CHECK(o.dropout >= 0 && o.dropout < 1, "adaptive_span_attention: dropout must be in [0, 1)");
  TORCH_CHECK(q.is_floating_point(), "adaptive_span_attention: the inputs must be floating point (float32, float64, "
              "bfloat16 or float16), got ", q.scalar_type());
  for (const auto* t : {&k, &v, &key_pe}) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                "adaptive_span_attention: all inputs must share dtype and device (q is ", q.scalar_type(), " on ",
                q.device(), ", another ", t->scalar_type(), " on ", t->device(), ")");
  }
  // The spans may stay float32 beside bf16 / fp16 inputs (mixed precision): z = ratio L needs its bits.
  TORCH_CHECK(span_ratio.device() == q.device() &&
                  (span_ratio.scalar_type() == q.scalar_type() || span_ratio.scalar_type() == at::kFloat),
              "adaptive_span_attention: all inputs must share dtype and device");
}

// ---- the backend table ----------------------------------------------------------------------------
// The op's rows in the order the entry walks them: the first that takes the inputs runs, unless
// SpanBackendOverride names one. The table is the one place that says which backend serves which
// device, dtype and width, and what each kernel row keeps for its backward (the Meta kernel's shape).
//   cuda       CUDA tensors the kernels take (float32 / bfloat16 / float16, D a multiple of 32 up to 256)
//   cpu        CPU tensors, any floating dtype: the fused kernel with its hand-written backward
//   reference  everything else (another device, width or dtype): autograd over the plain composition
// A kernel row's two halves run inside the private operators `spanformer::_adaptive_span_attention_forward`
// / `_backward`, which take the row's name; the reference row has no halves.
struct SpanBackend {
  const char* name;
  bool (*takes)(const at::Tensor& q);
  Forward (*forward)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                     const at::Tensor& span_ratio, const SpanAttentionOptions& o, bool keep);
  SpanAttentionGrads (*backward)(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                 const at::Tensor& out, const at::Tensor& saved, const SpanAttentionOptions& o);
  // What forward keeps, allocated without values (the Meta kernel): q (B, K, M, D), k (B, K, W + M, D).
  at::Tensor (*saved_like)(const at::Tensor& q, const at::Tensor& k, bool keep);
};

const SpanBackend kSpanBackends[] = {
#ifdef SPANFORMER_WITH_CUDA
    {"cuda", &cuda_glue::span_takes, &cuda_glue::span_attention_forward, &cuda_glue::span_attention_backward, &cuda_glue::span_saved_like},
#endif
    {"cpu", &cpu::span_takes, &cpu::span_attention_forward, &cpu::span_attention_backward, &cpu::span_saved_like},
    {"reference", [](const at::Tensor&) { return true; }, nullptr, nullptr, nullptr},
};

// The row SpanBackendOverride names (an index into kSpanBackends), or -1.
std::atomic<int> forced_span_row{-1};

const SpanBackend& span_backend(const at::Tensor& q) {
  return pick_row(kSpanBackends, forced_span_row, q, "adaptive_span_attention",
                  [](const SpanBackend& row, const at::Tensor& x) { return row.takes(x); });
}

// The kernel row a private operator was called with (the entry asked the table; a direct call from
// Python may name any row).
const SpanBackend& kernel_row(c10::string_view name) {
  for (const auto& row : kSpanBackends)
    if (name == row.name && row.forward) return row;
  fail("adaptive_span_attention: no kernel row '{}' in this build", std::string(name.data(), name.size()));
}

// A private operator's inputs: checked as the public entry checks them (a direct call from Python must
// not reach a kernel with shapes it would read past), and the row must take them.
void check_row_call(const SpanBackend& row, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& key_pe, const at::Tensor& span_ratio, const SpanCall& c) {
  check_arguments(q, k, v, key_pe, span_ratio, SpanAttentionOptions{c.attn_span, c.ramp, c.dropout, c.training, 0, {}});
  if (!row.takes(q))
    fail("adaptive_span_attention: the {} row cannot take {} inputs on {}", row.name, c10::toString(q.scalar_type()),
         q.device().str());
}

// The scalars of a call, as the private operators take them, in one struct.
SpanCall span_call(int64_t attn_span, double ramp, double dropout, bool training, int64_t seed,
                   at::IntArrayRef visited, bool keep, c10::string_view row) {
  return SpanCall{attn_span, ramp, dropout, training, seed, visited.vec(), keep, std::string(row.data(), row.size())};
}

// A row's options: the call's scalars with the seed in use and the visited distances resolved.
SpanAttentionOptions span_options(const at::Tensor& q, const at::Tensor& k, const at::Tensor& span_ratio,
                                  const SpanCall& c, int64_t seed) {
  SpanAttentionOptions o{c.attn_span, c.ramp, c.dropout, c.training, static_cast<uint64_t>(seed), c.visited};
  o.visited = resolve_visited(span_ratio, k.size(2) - q.size(2), o);
  return o;
}

using SpanGradTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using SpanForwardOp = Triple(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, int64_t, double, double, bool, int64_t, at::IntArrayRef, bool,
                             c10::string_view);
using SpanBackwardOp = SpanGradTuple(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, int64_t, double, double, bool, at::IntArrayRef,
                                     c10::string_view);

// The autograd function's row: both halves through the private operators, the row named in the call.
struct SpanDispatchedRow {
  static Triple forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                        const at::Tensor& span_ratio, const SpanCall& c) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("spanformer::_adaptive_span_attention_forward", "")
                         .typed<SpanForwardOp>();
    return op.call(q, k, v, key_pe, span_ratio, c.attn_span, c.ramp, c.dropout, c.training, c.seed, c.visited, c.keep,
                   c.row);
  }
  static std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                          const at::Tensor& out, const at::Tensor& saved, const at::Tensor& seed,
                                          const SpanCall& c) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("spanformer::_adaptive_span_attention_backward", "")
                         .typed<SpanBackwardOp>();
    auto g = op.call(grad_out, q, k, v, key_pe, span_ratio, out, saved, seed, c.attn_span, c.ramp, c.dropout,
                     c.training, c.visited, c.row);
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g), std::get<4>(g)};
  }
};

at::Tensor run_span_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                              const at::Tensor& span_ratio, const SpanCall& c) {
  SpanAttentionOptions o{c.attn_span, c.ramp, c.dropout, c.training,
                         static_cast<uint64_t>(resolve_seed(c.seed, c.training, c.dropout)), c.visited};
  return adaptive_span_attention_reference(q, k, v, key_pe, span_ratio, o);
}

// ---- the operators' kernels ---------------------------------------------------------------------

// spanformer::adaptive_span_attention (CompositeImplicitAutograd): checks once, picks the row.
at::Tensor span_attention_entry(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& key_pe_in, const at::Tensor& span_ratio, int64_t attn_span,
                                double ramp, double dropout, bool training, int64_t seed, at::IntArrayRef visited) {
  const OpAutocast cast(q_in, cpu::half_products_native);  // train.amp: the op's compute dtype (op_autocast.h); spans as they are
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in), key_pe = cast(key_pe_in);
  SpanAttentionOptions o{attn_span, ramp, dropout, training, 0, visited.vec()};
  check_arguments(q, k, v, key_pe, span_ratio, o);
  const bool keep = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                                                   key_pe.requires_grad() || span_ratio.requires_grad());
  const auto& row = span_backend(q);
  const SpanCall call{attn_span, ramp, dropout, training, seed, visited.vec(), keep, row.name};
  if (!row.forward) return run_span_reference(q, k, v, key_pe, span_ratio, call);
  return SpanAttentionFunction<SpanDispatchedRow>::apply(q, k, v, key_pe, span_ratio, attn_span, ramp, dropout,
                                                         training, seed, visited.vec(), keep, call.row);
}

// spanformer::_adaptive_span_attention_forward / _backward (any device): the named row's halves.
Triple span_forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                           const at::Tensor& span_ratio, int64_t attn_span, double ramp, double dropout, bool training,
                           int64_t seed, at::IntArrayRef visited, bool keep, c10::string_view row_name) {
  const auto c = span_call(attn_span, ramp, dropout, training, seed, visited, keep, row_name);
  const auto& row = kernel_row(row_name);
  check_row_call(row, q, k, v, key_pe, span_ratio, c);
  const int64_t used = resolve_seed(seed, training, dropout);
  auto f = row.forward(q, k, v, key_pe, span_ratio, span_options(q, k, span_ratio, c, used), keep);
  return {f.out, f.saved, seed_tensor(used, q)};
}

SpanGradTuple span_backward_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                   const at::Tensor& out, const at::Tensor& saved, const at::Tensor& seed,
                                   int64_t attn_span, double ramp, double dropout, bool training,
                                   at::IntArrayRef visited, c10::string_view row_name) {
  const auto c = span_call(attn_span, ramp, dropout, training, -1, visited, true, row_name);
  const auto& row = kernel_row(row_name);
  check_row_call(row, q, k, v, key_pe, span_ratio, c);
  // What the forward returned, as the row's forward returns it (the operator may be called directly);
  // asked on the Meta device, so that no memory is allocated for the comparison.
  const auto meta = [](const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kMeta)); };
  const auto kept = row.saved_like(meta(q), meta(k), true);
  if (grad_out.sizes() != q.sizes() || out.sizes() != q.sizes() || saved.sizes() != kept.sizes() ||
      saved.scalar_type() != kept.scalar_type() || saved.device() != q.device())
    fail("adaptive_span_attention backward: grad_out and out must be q's shape {} and saved the {} row's {} {} "
         "(got {}, {}, {} {})", fmt::join(q.sizes(), "x"), row.name, fmt::join(kept.sizes(), "x"),
         c10::toString(kept.scalar_type()), fmt::join(grad_out.sizes(), "x"), fmt::join(out.sizes(), "x"),
         fmt::join(saved.sizes(), "x"), c10::toString(saved.scalar_type()));
  const auto o = span_options(q, k, span_ratio, c, seed_value(seed, training, dropout));
  auto g = row.backward(grad_out, q, k, v, key_pe, span_ratio, out, saved, o);
  return {g.q, g.k, g.v, g.key_pe, g.span_ratio};
}

// What the halves return, without computing anything (Meta: torch.compile's fake tensors).
Triple span_forward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                         const at::Tensor& span_ratio, int64_t attn_span, double ramp, double dropout, bool training,
                         int64_t seed, at::IntArrayRef visited, bool keep, c10::string_view row_name) {
  return {at::empty(q.sizes(), q.options()), kernel_row(row_name).saved_like(q, k, keep),
          at::empty({}, q.options().dtype(at::kLong))};
}

SpanGradTuple span_backward_meta(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                 const at::Tensor& out, const at::Tensor& saved, const at::Tensor& seed,
                                 int64_t attn_span, double ramp, double dropout, bool training,
                                 at::IntArrayRef visited, c10::string_view row_name) {
  auto like = [](const at::Tensor& t) { return at::empty(t.sizes(), t.options()); };
  return {like(q), like(k), like(v), like(key_pe), like(span_ratio)};
}

at::Tensor span_reference_entry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                           const at::Tensor& span_ratio, int64_t attn_span, double ramp, double dropout, bool training,
                           int64_t seed) {
  SpanAttentionOptions o{attn_span, ramp, dropout, training, static_cast<uint64_t>(resolve_seed(seed, training, dropout)), {}};
  return adaptive_span_attention_reference(q, k, v, key_pe, span_ratio, o);
}

}  // namespace
}  // namespace spanformer::ops

// The operators (torch.ops.spanformer.* from Python; the C++ entry points below call them). The public
// two take the seed -1 for "draw one"; the private two are the halves of the kernel row they name.
TORCH_LIBRARY_FRAGMENT(spanformer, m) {
  m.def("adaptive_span_attention(Tensor q, Tensor k, Tensor v, Tensor key_pe, Tensor span_ratio, int attn_span, "
        "float ramp=32., float dropout=0., bool training=False, int seed=-1, int[] visited=[]) -> Tensor");
  m.def("adaptive_span_attention_reference(Tensor q, Tensor k, Tensor v, Tensor key_pe, Tensor span_ratio, "
        "int attn_span, float ramp=32., float dropout=0., bool training=False, int seed=-1) -> Tensor");
  // `saved` is what the row's forward keeps for its backward (src/ops/backends.h).
  m.def("_adaptive_span_attention_forward(Tensor q, Tensor k, Tensor v, Tensor key_pe, Tensor span_ratio, "
        "int attn_span, float ramp, float dropout, bool training, int seed, int[] visited, bool keep, str row) "
        "-> (Tensor out, Tensor saved, Tensor seed)");
  m.def("_adaptive_span_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor key_pe, "
        "Tensor span_ratio, Tensor out, Tensor saved, Tensor seed, int attn_span, float ramp, float dropout, "
        "bool training, int[] visited, str row) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(spanformer, CompositeImplicitAutograd, m) {
  m.impl("adaptive_span_attention", &spanformer::ops::span_attention_entry);
  m.impl("adaptive_span_attention_reference", &spanformer::ops::span_reference_entry);
}

// Any device: the named row says whether it takes the inputs.
TORCH_LIBRARY_IMPL(spanformer, CompositeExplicitAutograd, m) {
  m.impl("_adaptive_span_attention_forward", &spanformer::ops::span_forward_kernel);
  m.impl("_adaptive_span_attention_backward", &spanformer::ops::span_backward_kernel);
}

TORCH_LIBRARY_IMPL(spanformer, Meta, m) {
  m.impl("_adaptive_span_attention_forward", &spanformer::ops::span_forward_meta);
  m.impl("_adaptive_span_attention_backward", &spanformer::ops::span_backward_meta);
}

namespace spanformer::ops {

at::Tensor span_mask_unclamped(const at::Tensor& span_ratio, int64_t S, int64_t attn_span, double ramp) {
  auto distance_minus_one = at::arange(S - 1, -1, -1, span_ratio.options());       // (S), exact integers in the spans' dtype
  return ((span_ratio * double(attn_span)).view({-1, 1}) - distance_minus_one) / ramp + 1.0;  // (K, S)
}

const char* adaptive_span_attention_backend(const at::Tensor& q) { return span_backend(q).name; }

std::vector<std::string> adaptive_span_attention_backends() { return row_names(kSpanBackends); }

SpanBackendOverride::SpanBackendOverride(const std::string& row)
    : previous_(force_row(kSpanBackends, forced_span_row, row, "adaptive_span_attention")) {}

SpanBackendOverride::~SpanBackendOverride() { forced_span_row.store(previous_); }

at::Tensor adaptive_span_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                   const SpanAttentionOptions& options) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("spanformer::adaptive_span_attention", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t, double, double, bool, int64_t, at::IntArrayRef)>();
  return op.call(q, k, v, key_pe, span_ratio, options.attn_span, options.ramp, options.dropout, options.training,
                 static_cast<int64_t>(options.seed), options.visited);
}

at::Tensor adaptive_span_attention_reference(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                             const at::Tensor& key_pe_in, const at::Tensor& span_ratio,
                                             const SpanAttentionOptions& o) {
  const OpAutocast cast(q_in);
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in), key_pe = cast(key_pe_in);
  check_arguments(q, k, v, key_pe, span_ratio, o);
  const int64_t B = q.size(0), K = q.size(1), M = q.size(2), D = q.size(3), W = k.size(2) - M, L = o.attn_span;
  auto scores = unskew(at::matmul(q, k.transpose(-1, -2)));                         // (B, K, M, W)
  scores = (scores + at::matmul(q, key_pe.narrow(1, L - W, W))) / std::sqrt(double(D));
  auto p = at::softmax(scores, -1);                                                 // (B, K, M, W)
  auto m = span_mask_unclamped(span_ratio, W, L, o.ramp).view({K, 1, W});             // (K, 1, W), column c = distance W - c
  auto w = p * compat::clamp_closed_gradient(m, 0.0, 1.0);                         // (B, K, M, W), 1.x's clamp gradient
  auto a = w / (w.sum(-1, /*keepdim=*/true) + 1e-8);
  if (o.training && o.dropout > 0) {
    auto keep = at::empty({B, K, M, W}, at::kDouble);
    auto acc = keep.accessor<double, 4>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < K; ++h)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t c = 0; c < W; ++c) acc[b][h][i][c] = dropout_keep(o.seed, b, h, i, W - c, o.dropout) ? 1.0 : 0.0;
    a = a * keep.to(q.options()) / (1.0 - o.dropout);
  }
  return at::matmul(skew(a.to(v.scalar_type())), v);                               // (B, K, M, D)
}

}  // namespace spanformer::ops
