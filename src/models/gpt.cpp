#include "spanformer/models/gpt.h"
#include "spanformer/nn/dropout.h"
#include "spanformer/nn/positional.h"
#include "spanformer/ops/step_ops.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <torch/autograd.h>

#include <cmath>
#include <functional>

#include "spanformer/util/error.h"
#include "spanformer/util/torch_compat.h"
#include "ops/cpu/matvec.h"

namespace spanformer::models {
namespace {

// A layer's product: a decoding step's rows on the CPU as the streaming product
// (ops/cpu/matvec.h), anything else through the layer.
template <class Layer>
torch::Tensor product(Layer& layer, const torch::Tensor& x) {
  if (auto y = ops::cpu::decode_linear(x, layer->weight, layer->bias); y.defined()) return y;
  return layer(x);
}

}  // namespace

GptBlockOptions gpt_block_options(const GptModelConfig& config, int64_t layer) {
  attention::CausalSpec pattern;
  pattern.kind = config.attention;
  pattern.window = config.window;
  pattern.stride = config.stride_l();
  pattern.summary = config.sparse_summary;
  pattern.combine = config.sparse_combine;
  pattern.layer = layer;
  pattern.heads = config.n_head;
  pattern.lsh_rounds = config.lsh_hashes;
  pattern.lsh_buckets = config.buckets();
  pattern.lsh_chunk = config.lsh_chunk;
  pattern.dropout = config.attn_dropout;
  auto attention = GptAttentionOptions(config.d_model, config.n_head).pattern(pattern).impl(config.attn_impl);
  if (config.attention == attention::CausalKind::kAdaptiveSpan)
    attention.span(nn::AdaptiveSpanOptions(config.span_limit(), config.n_head)
                       .ramp(config.adapt_span_ramp)
                       .init(config.adapt_span_init)
                       .loss_coeff(config.adapt_span_loss));
  return GptBlockOptions(attention, config.inner_dim())
      .dropout(config.dropout)
      .ff_chunks(config.ff_chunks)
      .activation(config.activation);
}

namespace {

// A KV cache (B, K, C, D) with `rows` (B, K, N, D) after it. The cache is a view of a buffer of `slot`
// rows a head made here (every cache is: the first call makes one), starting at row `start`: the rows go
// into the room after the view, in place, and the C rows are not copied; without room, a new buffer
// with as many rows again to spare (so a decoding step copies its own row, and the cache moves only
// when its buffer doubles). The view's rows are those of `torch::cat({cache, rows}, 2)`.
torch::Tensor append_rows(const torch::Tensor& cache, const torch::Tensor& rows) {
  const int64_t B = rows.size(0), K = rows.size(1), N = rows.size(2), D = rows.size(3);
  const int64_t C = cache.defined() ? cache.size(2) : 0;
  if (C > 0 && cache.stride(3) == 1 && cache.stride(2) == D && cache.stride(0) == K * cache.stride(1)) {
    const int64_t slot = cache.stride(1) / D, start = cache.storage_offset() / D;
    if (start + C + N <= slot) {
      auto grown = cache.as_strided({B, K, C + N, D}, cache.strides(), cache.storage_offset());  // (B, K, C + N, D)
      grown.narrow(2, C, N).copy_(rows);
      return grown;
    }
  }
  auto buffer = torch::empty({B, K, 2 * (C + N), D}, rows.options());  // (B, K, slot, D)
  if (C > 0) buffer.narrow(2, 0, C).copy_(cache);
  buffer.narrow(2, C, N).copy_(rows);
  return buffer.narrow(2, 0, C + N);  // (B, K, C + N, D)
}

}  // namespace

GptAttentionImpl::GptAttentionImpl(GptAttentionOptions options) : options_(std::move(options)) {
  const int64_t H = options_.d_model();
  const bool shared_qk = options_.pattern().kind == attention::CausalKind::kLsh;  // Reformer: one q/k projection
  qkv = register_module("qkv", spanformer::nn::Linear(H, (shared_qk ? 2 : 3) * H));
  proj = register_module("proj", spanformer::nn::Linear(H, H));
  if (options_.span()) span = register_module("span", nn::AdaptiveSpan(*options_.span()));
}

attention::CausalSpec GptAttentionImpl::spec() const {
  attention::CausalSpec s = options_.pattern();
  s.span = span ? span.get() : nullptr;
  s.training = is_training();
  return s;
}

int64_t GptAttentionImpl::band(int64_t keys) const { return attention::causal_band(spec(), keys); }

torch::Tensor GptAttentionImpl::forward(const torch::Tensor& h, torch::Tensor* k_cache, torch::Tensor* v_cache,
                                        int64_t keep, const torch::Tensor& at) {
  const int64_t B = h.size(0), N = h.size(1), H = options_.d_model(), K = options_.heads(), D = H / K;
  if (options_.pattern().kind == attention::CausalKind::kLsh) {  // shared q/k (B, K, N, D), no cache
    if (k_cache) fail("gpt: lsh attention reads no KV cache");
    auto qv = product(qkv, h).view({B, N, 2, K, D}).permute({2, 0, 3, 1, 4});  // (2, B, K, N, D)
    auto qk = qv[0];
    auto out = attention::causal_attention(qk, qk, qv[1], spec(), options_.impl());  // (B, K, N, D)
    return product(proj, out.transpose(1, 2).reshape({B, N, H}));  // (B, N, H)
  }
  auto qkv_heads = product(qkv, h).view({B, N, 3, K, D}).permute({2, 0, 3, 1, 4});  // (3, B, K, N, D)
  auto q = qkv_heads[0], k = qkv_heads[1], v = qkv_heads[2];               // (B, K, N, D)
  if (at.defined()) {  // fixed shapes: row `at` of the (B, K, T, D) buffers, then keys 0 .. at
    k_cache->index_copy_(2, at, k);
    v_cache->index_copy_(2, at, v);
    auto out = attention::causal_attention_at(q, *k_cache, *v_cache, at, spec());  // (B, K, 1, D)
    return product(proj, out.transpose(1, 2).reshape({B, N, H}));                       // (B, 1, H)
  }
  if (k_cache) {  // the cached keys and values, then these: written into the cache's buffer
    k = append_rows(*k_cache, k);  // (B, K, C + N, D)
    v = append_rows(*v_cache, v);
  }
  auto out = attention::causal_attention(q, k, v, spec(), options_.impl());  // (B, K, N, D)
  if (k_cache) {
    const int64_t C = k.size(2);
    const int64_t kept = keep >= 0 ? std::min(C, keep) : C;
    *k_cache = k.narrow(2, C - kept, kept);  // (B, K, kept, D)
    *v_cache = v.narrow(2, C - kept, kept);
  }
  return product(proj, out.transpose(1, 2).reshape({B, N, H}));  // (B, N, H)
}

GptBlockImpl::GptBlockImpl(GptBlockOptions options) : options_(std::move(options)) {
  const int64_t H = options_.attention().d_model(), I = options_.d_inner();
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  attn = register_module("attn", GptAttention(options_.attention()));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  fc1 = register_module("fc1", spanformer::nn::Linear(H, I));
  fc2 = register_module("fc2", spanformer::nn::Linear(I, H));
}

torch::Tensor GptBlockImpl::attention_branch(const torch::Tensor& h, torch::Tensor* k_cache, torch::Tensor* v_cache,
                                             int64_t keep, const torch::Tensor& at) {
  return spanformer::nn::dropout(attn(ln1(h), k_cache, v_cache, keep, at), options_.dropout(), is_training());  // (B, N, H)
}

torch::Tensor GptBlockImpl::feed_forward(const torch::Tensor& z) {
  const bool tanh = options_.activation() == Activation::kGeluTanh;
  auto u = ops::step_kernels_take(z) ? ops::bias_gelu(at::linear(z, fc1->weight), fc1->bias, tanh)  // (B, n, I)
                                     : torch::gelu(product(fc1, z), tanh ? "tanh" : "none");
  return spanformer::nn::dropout(product(fc2, u), options_.dropout(), is_training());  // (B, n, H)
}

torch::Tensor GptBlockImpl::ff_branch(const torch::Tensor& h) {
  const int64_t chunks = options_.ff_chunks();
  if (chunks <= 1 || h.size(1) <= 1) return feed_forward(ln2(h));  // (B, N, H)
  std::vector<torch::Tensor> parts;
  for (const auto& x : h.chunk(std::min(chunks, h.size(1)), 1)) parts.push_back(feed_forward(ln2(x)));  // (B, n, H) each
  return torch::cat(parts, 1);  // (B, N, H)
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& h, torch::Tensor* k_cache, torch::Tensor* v_cache,
                                    int64_t keep, const torch::Tensor& at) {
  auto a = attention_branch(h, k_cache, v_cache, keep, at);  // (B, N, H)
  if (options_.ff_chunks() <= 1 && ops::step_kernels_take(h)) {  // x = h + a and ln2(x) in one op
    const auto x = ops::add_layer_norm(h, a, ln2->weight, ln2->bias, ln2->options.eps());
    return x.sum + feed_forward(x.out);  // (B, N, H)
  }
  auto x = h + a;             // (B, N, H)
  return x + ff_branch(x);    // (B, N, H)
}

namespace {

// The random state F and G run under (dropout masks, flash seeds, LSH rotations): the CPU generator,
// and the CUDA one for CUDA tensors.
struct RandomState {
  torch::Tensor cpu, cuda;
};
RandomState random_state(const torch::Device& device) {
  return {compat::generator_state(c10::DeviceType::CPU),
          device.is_cuda() ? compat::generator_state(c10::DeviceType::CUDA) : torch::Tensor()};
}
void set_random_state(const RandomState& s) {
  compat::set_generator_state(c10::DeviceType::CPU, s.cpu);
  if (s.cuda.defined()) compat::set_generator_state(c10::DeviceType::CUDA, s.cuda);
}

// The reversible stack as one autograd node (formulas in models/gpt.h). Inputs: x1, x2 (B, N, H), every
// block's parameters (block order, then each block's parameters() order) and the address of the model's
// block list, which owns the blocks and outlives the graph. Saved: the last (y1, y2) and the random
// state before each F and G.
class ReversibleStack : public torch::autograd::Function<ReversibleStack> {
 public:
  using Blocks = std::vector<GptBlock>;

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x1,
                                                const torch::Tensor& x2, at::TensorList params, int64_t blocks_address) {
    auto& blocks = *reinterpret_cast<Blocks*>(blocks_address);
    std::vector<torch::Tensor> cpu_states, cuda_states;
    auto y1 = x1, y2 = x2;  // (B, N, H)
    for (auto& block : blocks) {
      for (int branch = 0; branch < 2; ++branch) {
        auto state = random_state(x1.device());
        cpu_states.push_back(state.cpu);
        if (state.cuda.defined()) cuda_states.push_back(state.cuda);
        if (branch == 0) y1 = y1 + block->attention_branch(y2);
        else y2 = y2 + block->ff_branch(y1);
      }
    }
    ctx->save_for_backward({y1, y2});
    ctx->saved_data["blocks"] = blocks_address;
    ctx->saved_data["cpu_states"] = cpu_states;
    ctx->saved_data["cuda_states"] = cuda_states;
    return {y1, y2};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& blocks = *reinterpret_cast<Blocks*>(ctx->saved_data["blocks"].toInt());
    const auto cpu_states = ctx->saved_data["cpu_states"].toTensorVector();
    const auto cuda_states = ctx->saved_data["cuda_states"].toTensorVector();
    auto saved = ctx->get_saved_variables();
    auto y1 = saved[0].detach(), y2 = saved[1].detach();  // (B, N, H)
    auto dy1 = grads[0].defined() ? grads[0] : torch::zeros_like(y1), dy2 = grads[1].defined() ? grads[1] : torch::zeros_like(y2);
    const auto now = random_state(y1.device());
    size_t total = 0;
    for (auto& block : blocks) total += block->parameters().size();
    std::vector<torch::Tensor> param_grads(total);
    size_t offset = total;
    // One branch backward: the branch's output at `input`, the gradient into `input` and the block's
    // parameters (accumulated into param_grads).
    auto branch_backward = [&](size_t state, const std::function<torch::Tensor(const torch::Tensor&)>& branch,
                               const torch::Tensor& input, const torch::Tensor& grad_out,
                               const std::vector<torch::Tensor>& params, torch::Tensor& input_grad) {
      set_random_state({cpu_states[state], cuda_states.empty() ? torch::Tensor() : cuda_states[state]});
      torch::AutoGradMode enable(true);
      auto x = input.detach().requires_grad_();
      auto out = branch(x);  // (B, N, H)
      std::vector<torch::Tensor> wrt{x};
      std::vector<size_t> index;
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].requires_grad()) wrt.push_back(params[i]), index.push_back(i);
      auto g = torch::autograd::grad({out}, wrt, {grad_out}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
      input_grad = g[0];
      for (size_t i = 0; i < index.size(); ++i) {
        if (!g[i + 1].defined()) continue;
        auto& slot = param_grads[offset + index[i]];
        slot = slot.defined() ? slot + g[i + 1] : g[i + 1];
      }
      return out.detach();
    };
    for (size_t l = blocks.size(); l-- > 0;) {
      auto& block = blocks[l];
      const auto params = block->parameters();
      offset -= params.size();
      torch::Tensor grad_y1, grad_x2;
      auto g = branch_backward(2 * l + 1, [&](const torch::Tensor& x) { return block->ff_branch(x); }, y1, dy2, params, grad_y1);
      auto x2 = y2 - g;         // (B, N, H)
      auto dx1 = dy1 + grad_y1;
      auto f = branch_backward(2 * l, [&](const torch::Tensor& x) { return block->attention_branch(x); }, x2, dx1, params, grad_x2);
      auto x1 = y1 - f;
      auto dx2 = dy2 + grad_x2;
      y1 = x1, y2 = x2, dy1 = dx1, dy2 = dx2;
    }
    set_random_state(now);
    torch::autograd::variable_list out{dy1, dy2};
    out.insert(out.end(), param_grads.begin(), param_grads.end());
    out.push_back(torch::Tensor());  // blocks_address
    return out;
  }
};

}  // namespace

GptModelImpl::GptModelImpl(const GptModelConfig& config) : config_(config) {
  const int64_t H = config.d_model, V = config.vocab_size, T = config.context;
  wte = register_module("wte", torch::nn::Embedding(V, H));
  if (config.positions == Positions::kLearned) {
    wpe = register_module("wpe", torch::nn::Embedding(T, H));
  } else {
    sinusoid = register_buffer("sinusoid", nn::sinusoidal_positions(T, H));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < config.n_layer; ++l) {
    block_list_.push_back(GptBlock(gpt_block_options(config, l)));
    blocks->push_back(block_list_.back());
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  if (!config.tie_weights) head = register_module("head", spanformer::nn::Linear(torch::nn::LinearOptions(H, V).bias(false)));

  // GPT-2 initialisation.
  torch::NoGradGuard no_grad;
  const double residual_std = config.init_std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      linear->weight.normal_(0, config.init_std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0, config.init_std);
    }
  }
  for (auto& block : block_list_) {
    block->attn->proj->weight.normal_(0, residual_std);
    block->fc2->weight.normal_(0, residual_std);
  }
}

torch::Tensor GptModelImpl::forward(const torch::Tensor& x, GptCache* cache) {
  const int64_t N = x.size(1), T = config_.context, p0 = cache ? cache->position : 0;
  if (p0 + N > T) fail("gpt: tokens at positions {} .. {} lie beyond the context of {}", p0, p0 + N - 1, T);
  const torch::Tensor at = cache ? cache->at : torch::Tensor();  // fixed shapes: the position on the device
  if (at.defined() && N != 1) fail("gpt: a fixed-shape cache takes one token a call (got {})", N);
  const auto& table = wpe ? wpe->weight : sinusoid;                                        // (T, H)
  auto positions = at.defined() ? table.index_select(0, at) : table.narrow(0, p0, N);      // (N, H)
  auto h = spanformer::nn::dropout(wte(x) + positions, config_.dropout, is_training());       // (B, N, H)
  if (cache && cache->k.empty()) {
    cache->k.resize(block_list_.size());
    cache->v.resize(block_list_.size());
  }
  if (config_.reversible && !cache && recompute && torch::GradMode::is_enabled()) {
    std::vector<torch::Tensor> params;
    for (auto& block : block_list_)
      for (auto& p : block->parameters()) params.push_back(p);
    auto y = ReversibleStack::apply(h, h, at::TensorList(params), reinterpret_cast<int64_t>(&block_list_));  // 2 x (B, N, H)
    h = (y[0] + y[1]) / 2;
  } else if (config_.reversible) {  // the same composition, autograd's way (or no gradient at all)
    auto x1 = h, x2 = h;            // (B, N, H)
    for (size_t l = 0; l < block_list_.size(); ++l) {
      auto& block = block_list_[l];
      const int64_t keep = cache && cache->trim ? block->attn->band(T) - 1 : -1;
      x1 = x1 + (cache ? block->attention_branch(x2, &cache->k[l], &cache->v[l], keep, at) : block->attention_branch(x2));
      x2 = x2 + block->ff_branch(x1);
    }
    h = (x1 + x2) / 2;
  } else {
    for (size_t l = 0; l < block_list_.size(); ++l) {
      auto& block = block_list_[l];
      const int64_t keep = cache && cache->trim ? block->attn->band(T) - 1 : -1;
      h = cache ? block->forward(h, &cache->k[l], &cache->v[l], keep, at) : block->forward(h);  // (B, N, H)
    }
  }
  if (cache) cache->position += N;
  return ln_f(h);  // (B, N, H)
}

torch::Tensor GptModelImpl::logits(const torch::Tensor& hidden) {
  if (head) return product(head, hidden);  // (B, N, V)
  if (auto y = ops::cpu::decode_linear(hidden, wte->weight, {}); y.defined()) return y;  // a decoding step
  return torch::matmul(hidden, wte->weight.t());  // (B, N, V)
}

void GptModelImpl::lay_out_for_decoding() {
  torch::NoGradGuard no_grad;
  for (const auto& block : block_list_) {
    for (const auto& w : {block->attn->qkv->weight, block->attn->proj->weight, block->fc1->weight, block->fc2->weight}) {
      auto weight = w;  // (out, in)
      if (!weight.device().is_cpu() || weight.dim() != 2) continue;
      if (weight.scalar_type() == torch::kBFloat16) {
        if (!weight.is_contiguous()) weight.set_data(weight.contiguous());  // (out, in) storage
      } else if (weight.is_contiguous()) {
        weight.set_data(weight.t().contiguous().t());  // (out, in) view of (in, out) storage
      }
    }
  }
}

std::string GptModelImpl::fixed_shape_refusal() const {
  if (config_.attention == attention::CausalKind::kLsh)
    return "lsh attention keeps no KV cache (its buckets are drawn again for every context)";
  return "";
}

namespace {

// The growing cache's keys and values (B, K, kept, D) at positions [position - kept, position) into
// the fixed-shape buffers (B, K, T, D), made at the first call and reused after (a graph reads them).
void fill_fixed(const GptCache& cache, GptCache& fixed, int64_t T) {
  if (fixed.k.empty()) {
    for (size_t l = 0; l < cache.k.size(); ++l) {
      auto size = cache.k[l].sizes().vec();
      size[2] = T;
      fixed.k.push_back(torch::zeros(size, cache.k[l].options()));  // (B, K, T, D)
      fixed.v.push_back(torch::zeros(size, cache.v[l].options()));
    }
    fixed.at = torch::zeros({1}, cache.k[0].options().dtype(torch::kLong));  // (1)
  }
  const int64_t p = cache.position;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    const int64_t kept = cache.k[l].size(2);
    fixed.k[l].zero_().narrow(2, p - kept, kept).copy_(cache.k[l]);
    fixed.v[l].zero_().narrow(2, p - kept, kept).copy_(cache.v[l]);
  }
  fixed.position = p;
  fixed.at.fill_(p);
}

}  // namespace

torch::Tensor GptModelImpl::extend(const torch::Tensor& x, GptDecoder& d) {
  const int64_t n = x.size(1), T = config_.context;
  auto host = x.to(torch::kCPU).contiguous();
  d.history.insert(d.history.end(), host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + n);
  const auto end = static_cast<int64_t>(d.history.size());
  const bool slide = end - d.start > T;
  if (slide) d.start = end - std::max(n, T / 2);
  const bool use_cache = d.use_cache && config_.attention != attention::CausalKind::kLsh;  // lsh: recompute
  if (d.fixed_shapes) {
    if (const auto why = fixed_shape_refusal(); !why.empty()) fail("gpt: generation at fixed shapes: {}", why);
    if (!d.use_cache) fail("gpt: generation at fixed shapes runs on the KV cache (use_cache is off)");
    if (!slide && n == 1 && !d.fixed.k.empty() && d.fixed.position + 1 == end - d.start) {
      const int64_t p = d.fixed.position;  // the token's position; the host's count, the device's `at`
      d.fixed.at.fill_(p);
      const GptStepFn step = [&](const torch::Tensor& token, const torch::Tensor& at) {
        GptCache view = d.fixed;  // the same buffers, `at` the one the step is given
        view.at = at;
        return forward(token, &view);  // (1, 1, H)
      };
      auto hidden = d.runner ? d.runner(x, d.fixed.at, step) : step(x, d.fixed.at);
      d.fixed.position = p + 1;
      return hidden;
    }
  }
  if (use_cache && !slide && !d.fixed_shapes) {
    d.cache.trim = d.trim;
    return forward(x, &d.cache);  // (1, n, H)
  }
  // The context encoded anew (a slide, recomputation; at fixed shapes also the first call and several
  // tokens at once): a fresh growing cache, whose keys and values then fill the fixed buffers.
  auto context = torch::tensor(std::vector<int64_t>(d.history.begin() + d.start, d.history.end()), torch::kLong)
                     .view({1, -1}).to(x.device());  // (1, end - start)
  torch::Tensor hidden;  // (1, end - start, H)
  if (use_cache) {
    d.cache = GptCache{};
    d.cache.trim = d.trim;
    hidden = forward(context, &d.cache);
    if (d.fixed_shapes) fill_fixed(d.cache, d.fixed, T);
  } else {
    hidden = forward(context);
  }
  return hidden.narrow(1, hidden.size(1) - n, n);  // (1, n, H)
}

torch::Tensor GptModelImpl::span_loss() const {
  torch::Tensor total = torch::zeros({}, wte->weight.options());
  for (const auto& block : block_list_)
    if (block->attn->span) total = total + block->attn->span->loss();
  return total;
}

void GptModelImpl::clamp_spans() {
  for (auto& block : block_list_)
    if (block->attn->span) {
      block->attn->span->clamp_();
      block->attn->span->sync_host();
    }
}

std::vector<std::vector<double>> GptModelImpl::spans() const {
  std::vector<std::vector<double>> out;
  for (const auto& block : block_list_) {
    if (!block->attn->span) continue;
    std::vector<double> z;
    for (double r : block->attn->span->host_ratios())
      z.push_back(r * static_cast<double>(block->attn->span->options().attn_span()));
    out.push_back(std::move(z));
  }
  return out;
}

}  // namespace spanformer::models
