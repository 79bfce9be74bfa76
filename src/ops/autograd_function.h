// The one autograd function of each op, over any backend row of src/ops/backends.h. A Row is a struct
// with two static functions: forward (returns the output, what backward reads and the dropout seed it
// used, as a 0-dim int64 tensor on the inputs' device) and backward. The ops' dispatcher entries use rows
// that call the private `spanformer::_*_forward / _*_backward` operators (so torch.compile traces both
// halves through their fake kernels; the span pair takes the row's name, its Meta kernel the row's
// saved shape); the tests of the CPU model of CUDA use rows that call the CUDA
// glue directly. Either way the same forward saves the same tensors for the same backward.
//
//   SpanRow:  forward(q, k, v, key_pe, span_ratio, SpanCall)            -> (out, saved, seed)
//             backward(grad_out, q, k, v, key_pe, span_ratio, out, saved, seed, SpanCall) -> 5 gradients
//   FlashRow: forward(q, k, v, FlashCall)                               -> (out, lse, seed)
//             backward(grad_out, q, k, v, out, lse, seed, FlashCall)    -> 3 gradients, or 4 with the sinks'
//             (FlashCall carries softcap and sinks; a row without them gets 0 and an undefined tensor;
//             apply() takes has_sinks and, without sinks, any placeholder tensor; key_ranges the same way)
// Seeds: SpanCall / FlashCall carry the caller's seed, -1 = the forward draws one from LibTorch's default
// CPU generator when it drops anything (at run time, not when a graph is traced).
#pragma once
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <string>
#include <tuple>
#include <vector>

namespace spanformer::ops {

using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

struct SpanCall {
  int64_t attn_span;
  double ramp, dropout;
  bool training;
  int64_t seed;                  // -1: drawn by the forward when it drops anything
  std::vector<int64_t> visited;  // empty: read from span_ratio by the forward
  bool keep;                     // a backward will follow: keep what it needs
  std::string row;               // the backend row that runs both halves (src/ops/backends.h)
};

struct FlashCall {
  int64_t band;  // 1 .. C
  double dropout;
  bool training;
  int64_t seed;  // -1: drawn by the forward when it drops anything
  int64_t tile;
  bool cuda_kernel;
  double softcap = 0.0;  // FlashOptions::softcap
  at::Tensor sinks;      // FlashOptions::sinks, (K) or undefined
  at::Tensor key_ranges;  // FlashOptions::key_ranges, (B, 2) or undefined
};

template <class Row>
class SpanAttentionFunction : public torch::autograd::Function<SpanAttentionFunction<Row>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                            int64_t attn_span, double ramp, double dropout, bool training, int64_t seed,
                            std::vector<int64_t> visited, bool keep, std::string row) {
    const SpanCall call{attn_span, ramp, dropout, training, seed, std::move(visited), keep, std::move(row)};
    auto [out, saved, seed_used] = Row::forward(q, k, v, key_pe, span_ratio, call);
    ctx->save_for_backward({q, k, v, key_pe, span_ratio, out, saved, seed_used});
    ctx->saved_data["attn_span"] = attn_span;
    ctx->saved_data["ramp"] = ramp;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["training"] = training;
    ctx->saved_data["visited"] = call.visited;
    ctx->saved_data["row"] = call.row;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    const SpanCall call{ctx->saved_data["attn_span"].toInt(), ctx->saved_data["ramp"].toDouble(),
                        ctx->saved_data["dropout"].toDouble(),  ctx->saved_data["training"].toBool(),
                        -1, ctx->saved_data["visited"].toIntVector(), true, ctx->saved_data["row"].toStringRef()};
    auto g = Row::backward(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], call);
    return {g[0], g[1], g[2], g[3], g[4], {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

template <class Row>
class FlashFunction : public torch::autograd::Function<FlashFunction<Row>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t band, double dropout, bool training, int64_t seed,
                            int64_t tile, bool cuda_kernel, double softcap, bool has_sinks, const at::Tensor& sinks_in,
                            bool has_ranges, const at::Tensor& ranges_in) {
    // Without sinks, sinks_in is a placeholder (an undefined tensor cannot be an autograd function's input).
    const at::Tensor sinks = has_sinks ? sinks_in : at::Tensor();
    const at::Tensor ranges = has_ranges ? ranges_in : at::Tensor();
    const FlashCall call{band, dropout, training, seed, tile, cuda_kernel, softcap, sinks, ranges};
    auto [out, lse, seed_used] = Row::forward(q, k, v, call);
    ctx->save_for_backward({q, k, v, out, lse, seed_used, sinks, ranges});
    ctx->saved_data["band"] = band;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["training"] = training;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["cuda_kernel"] = cuda_kernel;
    ctx->saved_data["softcap"] = softcap;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    const FlashCall call{ctx->saved_data["band"].toInt(),     ctx->saved_data["dropout"].toDouble(),
                         ctx->saved_data["training"].toBool(), -1,
                         ctx->saved_data["tile"].toInt(),      ctx->saved_data["cuda_kernel"].toBool(),
                         ctx->saved_data["softcap"].toDouble(), s[6], s[7]};
    auto g = Row::backward(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], call);
    const at::Tensor dsinks = g.size() > 3 && s[6].defined() ? g[3] : at::Tensor();
    return {g[0], g[1], g[2], {}, {}, {}, {}, {}, {}, {}, {}, dsinks, {}, {}};
  }
};

// The seed a forward uses: the caller's, or a fresh draw when it drops anything; as the 0-dim int64
// tensor the forward returns (on `like`'s device, so that fake tensors agree with real ones).
int64_t resolve_seed(int64_t seed, bool training, double dropout);
at::Tensor seed_tensor(int64_t seed, const at::Tensor& like);
// The seed a backward reads back (one host read on CUDA, only when it drops anything).
int64_t seed_value(const at::Tensor& seed, bool training, double dropout);

}  // namespace spanformer::ops
