#include "spanformer/models/xl.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "spanformer/attention/record.h"
#include "spanformer/nn/gumbel.h"
#include "spanformer/util/error.h"

namespace spanformer::models::xl {

torch::Tensor rel_shift(const torch::Tensor& x) {
  auto sizes = x.sizes().vec();
  const int64_t Q = sizes[sizes.size() - 2], R = sizes.back();
  auto pad_sizes = sizes;
  pad_sizes.back() = 1;
  auto padded = torch::cat({torch::zeros(pad_sizes, x.options()), x}, -1);  // (..., Q, R + 1)
  auto view_sizes = sizes;
  view_sizes[view_sizes.size() - 2] = R + 1;
  view_sizes.back() = Q;
  padded = padded.view(view_sizes);                                          // (..., R + 1, Q)
  return padded.narrow(-2, 1, R).reshape(sizes);                             // (..., Q, R)
}

torch::Tensor inv_freq(int64_t d_model, const torch::TensorOptions& options) {
  return 1.0 / torch::pow(10000.0, torch::arange(0, d_model, 2, options) / static_cast<double>(d_model));  // (H / 2)
}

torch::Tensor sinusoid(const torch::Tensor& pos, int64_t d_model) {
  auto angles = torch::outer(pos, inv_freq(d_model, pos.options()));  // (R, H / 2)
  return torch::cat({torch::sin(angles), torch::cos(angles)}, -1);  // (R, H)
}

torch::Tensor attention_mask(int64_t qlen, int64_t mlen, bool same_length, int64_t mem_len, torch::Device device) {
  const int64_t klen = mlen + qlen;
  auto ones = torch::ones({qlen, klen}, torch::TensorOptions().dtype(torch::kBool).device(device));
  auto mask = torch::triu(ones, 1 + mlen);  // future keys
  if (same_length) {
    const int64_t mask_len = klen - mem_len;
    const int64_t shift = mask_len > 0 ? qlen - mask_len : qlen;
    mask = mask | torch::tril(ones, -shift);
  }
  return mask;
}

// ---- blocks ------------------------------------------------------------------------------------

namespace {
// Distances (1 = the query itself) of the last W keys from the M queries of a window of W keys:
// W - M + 1 + i - j.                                                              (M, W)
torch::Tensor key_distances(int64_t M, int64_t W, const torch::TensorOptions& options) {
  auto i = torch::arange(M, options).view({M, 1}), j = torch::arange(W, options).view({1, W});
  return static_cast<double>(W - M + 1) + i - j;
}
}  // namespace

bool RelAttentionImpl::per_head_windows(const std::vector<int64_t>& visited, int64_t Kl, int64_t M) const {
  switch (impl_) {
    case attention::AttnImpl::kPlain: return false;
    case attention::AttnImpl::kFused: return true;
    case attention::AttnImpl::kAuto: break;
  }
  return attention::auto_rule::xl_per_head_windows(Kl, M, visited);  // attention/attn_impl.h
}

RelAttentionOptions rel_attention_options(const XlModelConfig& c) {
  auto o = RelAttentionOptions(c.d_model, c.n_head, c.d_head)
               .pre_lnorm(c.pre_lnorm)
               .dropout(c.dropout)
               .dropatt(c.dropatt)
               .untie_r(c.untie_r)
               .init_std(c.init_std)
               .impl(c.attn_impl);
  if (c.adapt_span)
    o.span(nn::AdaptiveSpanOptions(c.span_limit(), c.n_head)
               .ramp(c.adapt_span_ramp)
               .init(c.adapt_span_init)
               .loss_coeff(c.adapt_span_loss)
               .adapt_cache(true));
  return o;
}

XlFeedForwardOptions feed_forward_options(const XlModelConfig& c) {
  return XlFeedForwardOptions(c.d_model, c.d_inner).pre_lnorm(c.pre_lnorm).dropout(c.dropout);
}

RelAttentionImpl::RelAttentionImpl(RelAttentionOptions o)
    : K_(o.heads()), D_(o.d_head()), pre_lnorm_(o.pre_lnorm()), impl_(o.impl()) {
  const int64_t H = o.d_model(), KD = K_ * D_;
  qkv = register_module("qkv", spanformer::nn::Linear(torch::nn::LinearOptions(H, 3 * KD).bias(false)));
  r_net = register_module("r_net", spanformer::nn::Linear(torch::nn::LinearOptions(H, KD).bias(false)));
  o_net = register_module("o_net", spanformer::nn::Linear(torch::nn::LinearOptions(KD, H).bias(false)));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  drop = register_module("drop", spanformer::nn::Dropout(o.dropout()));
  dropatt = register_module("dropatt", spanformer::nn::Dropout(o.dropatt()));
  if (o.untie_r()) {
    r_w_bias = register_parameter("r_w_bias", torch::randn({K_, D_}) * o.init_std());
    r_r_bias = register_parameter("r_r_bias", torch::randn({K_, D_}) * o.init_std());
  }
  if (o.span()) span = register_module("span", nn::AdaptiveSpan(*o.span()));
}

torch::Tensor RelAttentionImpl::forward(const torch::Tensor& h, const torch::Tensor& mem, const torch::Tensor& r,
                                        const torch::Tensor& u_shared, const torch::Tensor& v_shared,
                                        const torch::Tensor& mask) {
  const int64_t B = h.size(0), M = h.size(1), Mm = mem.size(1);
  const auto& u = r_w_bias.defined() ? r_w_bias : u_shared;
  const auto& v = r_r_bias.defined() ? r_r_bias : v_shared;
  // With adaptive span, head k reads the distances 0 .. S_k - 1 (S_k = visited_distance(z_k, R, window),
  // counting the query itself as the first): the layer reads only the last S - 1 memory rows,
  // S = max_k S_k, and each head's softmax runs over its own S_k keys.
  std::vector<int64_t> visited;
  int64_t keep = Mm;
  if (span) {
    visited = span->visited(Mm + M);
    keep = std::min<int64_t>(Mm, *std::max_element(visited.begin(), visited.end()) - 1);
  }
  const int64_t Kl = keep + M, Kfull = r.size(0);
  auto cat = keep > 0 ? torch::cat({mem.narrow(1, Mm - keep, keep), h}, 1) : h;  // (B, Kl, H)
  auto heads = qkv(pre_lnorm_ ? norm(cat) : cat);                                  // (B, Kl, 3KD)
  auto parts = heads.chunk(3, -1);
  auto q = parts[0].narrow(1, keep, M).view({B, M, K_, D_}).transpose(1, 2);       // (B, K, M, D)
  auto k = parts[1].view({B, Kl, K_, D_}).permute({0, 2, 3, 1});                   // (B, K, D, Kl)
  auto val = parts[2].view({B, Kl, K_, D_}).transpose(1, 2);                       // (B, K, Kl, D)
  auto rk = r_net(r.narrow(0, Kfull - Kl, Kl)).view({Kl, K_, D_}).permute({1, 2, 0});  // (K, D, Kl)
  const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
  auto full_mask = mask.narrow(1, Kfull - Kl, Kl);                                 // (M, Kl)
  torch::Tensor heads_out;                                                         // (B, K, M, D)
  if (span && per_head_windows(visited, Kl, M) && !attention::WeightRecorder::active()) {
    // Head k's products over its own last W_k = min(Kl, S_k - 1 + M) keys only.
    std::vector<torch::Tensor> outs;
    for (int64_t hd = 0; hd < K_; ++hd) {
      const int64_t W = std::min(Kl, visited[hd] - 1 + M);
      auto qh = q.select(1, hd);                                                   // (B, M, D)
      auto ac = torch::matmul(qh + u[hd], k.select(1, hd).narrow(2, Kl - W, W));   // (B, M, W)
      auto bd = rel_shift(torch::matmul(qh + v[hd], rk.select(0, hd).narrow(1, Kl - W, W)));  // (B, M, W)
      auto distance = key_distances(M, W, h.options());                            // (M, W)
      auto hidden = full_mask.narrow(1, Kl - W, W) | (distance > static_cast<double>(visited[hd]));
      auto prob = torch::softmax(((ac + bd) * scale).masked_fill(hidden, -std::numeric_limits<float>::infinity()), -1);
      prob = dropatt(span->forward_at(prob, distance, hd));                        // (B, M, W)
      outs.push_back(torch::matmul(prob, val.select(1, hd).narrow(1, Kl - W, W))); // (B, M, D)
    }
    heads_out = torch::stack(outs, 1);
  } else {
    auto ac = torch::matmul(q + u.view({1, K_, 1, D_}), k);                        // (B, K, M, Kl) content
    auto bd = rel_shift(torch::matmul(q + v.view({1, K_, 1, D_}), rk));            // (B, K, M, Kl) position
    auto hidden = full_mask.view({1, 1, M, Kl});                                   // (1, 1, M, Kl)
    torch::Tensor distance;                                                        // (M, Kl), 1 = the query
    if (span) {
      distance = key_distances(M, Kl, h.options());
      auto limit = torch::tensor(visited, h.options()).view({K_, 1, 1});           // (K, 1, 1)
      hidden = hidden | (distance.unsqueeze(0) > limit).unsqueeze(0);              // (1, K, M, Kl)
    }
    auto prob = torch::softmax(((ac + bd) * scale).masked_fill(hidden, -std::numeric_limits<float>::infinity()), -1);
    if (span) prob = span->forward_at(prob, distance);                             // masked, renormalised
    if (auto* recorder = attention::WeightRecorder::active()) recorder->add_by_position(prob);
    heads_out = torch::matmul(dropatt(prob), val);                                 // (B, K, M, D)
  }
  auto out = heads_out.transpose(1, 2).reshape({B, M, K_ * D_});                 // (B, M, KD)
  out = drop(o_net(out));                                                        // (B, M, H)
  return pre_lnorm_ ? h + out : norm(h + out);
}

FeedForwardImpl::FeedForwardImpl(XlFeedForwardOptions o) : pre_lnorm_(o.pre_lnorm()) {
  fc1 = register_module("fc1", spanformer::nn::Linear(o.d_model(), o.d_inner()));
  fc2 = register_module("fc2", spanformer::nn::Linear(o.d_inner(), o.d_model()));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()})));
  drop = register_module("drop", spanformer::nn::Dropout(o.dropout()));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& h) {
  auto core = [&](const torch::Tensor& x) { return drop(fc2(drop(torch::relu(fc1(x))))); };  // (B, M, H)
  return pre_lnorm_ ? h + core(norm(h)) : norm(h + core(h));
}

// ---- the model ---------------------------------------------------------------------------------

XlModelImpl::XlModelImpl(const XlModelConfig& c) : config_(c), blocks_(c.blocks()) {
  validate(c);
  if (c.vocab_size <= 0) fail("model: vocab_size must be known (prepare the data first)");
  if (blocks_.empty()) fail("model: no blocks");
  nn::AdaptiveOptions ao;
  ao.vocab_size = c.vocab_size;
  ao.d_embed = c.embed_dim();
  ao.d_proj = c.d_model;
  if (c.adaptive) ao.cutoffs = c.cutoffs;
  ao.div_val = c.adaptive ? c.div_val : 1;
  ao.init_std = c.init_std;
  ao.proj_init_std = c.proj_init_std;
  word_emb = register_module("word_emb", nn::AdaptiveEmbedding(ao));
  crit = register_module("crit", nn::AdaptiveLogSoftmax(ao, word_emb.get(), c.tie_weight, c.tie_projs));
  drop = register_module("drop", spanformer::nn::Dropout(c.dropout));
  if (!c.untie_r) {
    r_w_bias = register_parameter("r_w_bias", torch::randn({c.n_head, c.d_head}) * c.init_std);
    r_r_bias = register_parameter("r_r_bias", torch::randn({c.n_head, c.d_head}) * c.init_std);
  }
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const BlockKind kind = blocks_[b];
    attn.push_back(kind == BlockKind::kFeedForward ? RelAttention(nullptr)
                                                   : register_module("attn_" + std::to_string(b), RelAttention(rel_attention_options(c))));
    ff.push_back(kind == BlockKind::kAttention ? FeedForward(nullptr)
                                               : register_module("ff_" + std::to_string(b), FeedForward(feed_forward_options(c))));
  }
  if (c.search) alpha = register_parameter("alpha", torch::zeros({static_cast<int64_t>(blocks_.size()), 3}));
  // The reference's weights_init: N(0, init_std) weights, zero biases, LayerNorm weight N(1, init_std).
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* lin = m->as<torch::nn::Linear>()) {
      lin->weight.normal_(0, c.init_std);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* ln = m->as<torch::nn::LayerNorm>()) {
      ln->weight.normal_(1.0, c.init_std);
      ln->bias.zero_();
    }
  }
}

std::vector<torch::Tensor> XlModelImpl::initial_mems(int64_t batch) const {
  auto options = word_emb->tables[0].options();
  return std::vector<torch::Tensor>(blocks_.size(), torch::zeros({batch, 0, config_.d_model}, options));
}

torch::Tensor XlModelImpl::forward(const torch::Tensor& x, std::vector<torch::Tensor>& mems, const Lengths& len,
                                   const torch::Tensor& weights) {
  const auto N = static_cast<int64_t>(blocks_.size());
  if (static_cast<int64_t>(mems.size()) != N) fail("model: {} memories given for {} blocks", mems.size(), N);
  if (config_.search && !weights.defined()) fail("model: a super-network needs block weights");
  if (config_.adapt_span) {
    if (len.ext_len > 0) fail("model: ext_len > 0 with adapt_span is not supported");
    sync_spans();
  }
  const int64_t B = x.size(0), Q = x.size(1);
  // mlen: the longest memory. Without adaptive span every attending block holds the same length; with
  // it each block keeps what its spans need (below), and reads the last rows of r and of the mask.
  int64_t mlen = 0;
  for (int64_t b = 0; b < N; ++b)
    if (blocks_[b] != BlockKind::kFeedForward) mlen = std::max(mlen, mems[b].size(1));
  const int64_t klen = mlen + Q;
  auto h = drop(word_emb(x));                                                  // (B, Q, H)
  auto mask = attention_mask(Q, mlen, len.same_length, len.mem_len, x.device());  // (Q, Kl)
  auto pos = torch::arange(klen - 1, -1, -1.0, h.options());                  // (Kl) distances
  if (len.clamp_len > 0) pos = pos.clamp_max(static_cast<double>(len.clamp_len));
  auto r = drop(sinusoid(pos, config_.d_model));                               // (Kl, H)
  // Host copy of the block weights: candidates with an exact zero weight (argmax evaluation) are skipped.
  torch::Tensor w_host;
  if (weights.defined() && !weights.requires_grad()) w_host = weights.to(torch::kCPU, torch::kDouble);
  std::vector<torch::Tensor> inputs(N);
  for (int64_t b = 0; b < N; ++b) {
    inputs[b] = h;
    torch::Tensor mem;  // (B, Mm, H)
    if (blocks_[b] != BlockKind::kFeedForward) {
      if (!config_.adapt_span && mems[b].size(1) != mlen)
        fail("model: block {} has a memory of {} states, the others {}", b, mems[b].size(1), mlen);
      mem = mems[b];
    }
    if (blocks_[b] == BlockKind::kAttention) {
      h = attn[b](h, mem, r, r_w_bias, r_r_bias, mask);
    } else if (blocks_[b] == BlockKind::kFeedForward) {
      h = ff[b](h);
    } else {
      auto w = weights[b];  // (3)
      auto skip = [&](int64_t k) { return w_host.defined() && w_host[b][k].item<double>() == 0.0; };
      torch::Tensor out = torch::zeros_like(h);
      if (!skip(kAttention)) out = out + w[kAttention] * attn[b](h, mem, r, r_w_bias, r_r_bias, mask);
      if (!skip(kFeedForward)) out = out + w[kFeedForward] * ff[b](h);
      if (!skip(kIdentity)) out = out + w[kIdentity] * h;
      h = out;
    }
  }
  h = drop(h);
  // New memories: rows [end - mem_len, end) of [mem; input] with end = Q + max(0, mlen - ext_len): the
  // reference's _update_mems(hids, mems, qlen, mlen) computes mlen + max(0, qlen - ext_len) but is
  // called with the two lengths swapped, and we keep its results (equal to mlen + Q - ext_len once
  // mlen >= ext_len; different while the memory fills, e.g. on the first segment). With adaptive span
  // (ext_len 0) a block keeps at most its AdaptiveSpan::cache_size() last states.
  torch::NoGradGuard no_grad;
  const int64_t end = Q + std::max<int64_t>(0, mlen - len.ext_len);
  for (int64_t b = 0; b < N; ++b) {
    if (blocks_[b] == BlockKind::kFeedForward) {
      mems[b] = torch::zeros({B, 0, config_.d_model}, h.options());
      continue;
    }
    const int64_t Mm = mems[b].size(1), rows = end - (mlen - Mm);  // [mem; input] rows up to end
    const int64_t keep = std::min(len.mem_len, attn[b]->span ? attn[b]->span->cache_size() : len.mem_len);
    auto cat = Mm > 0 ? torch::cat({mems[b], inputs[b].detach()}, 1) : inputs[b].detach();  // (B, Mm + Q, H)
    const int64_t begin = std::max<int64_t>(0, rows - keep);
    mems[b] = cat.narrow(1, begin, rows - begin).contiguous();                              // (B, Mm', H)
  }
  return h;
}

void XlModelImpl::sync_spans() {
  std::vector<torch::Tensor> ratios;
  for (auto& a : attn)
    if (a && a->span) ratios.push_back(a->span->span_ratio.detach());
  if (ratios.empty()) return;
  auto host = torch::cat(ratios).to(torch::kCPU, torch::kDouble).contiguous();  // one transfer
  const double* p = host.data_ptr<double>();
  for (auto& a : attn) {
    if (!a || !a->span) continue;
    const int64_t K = a->span->options().nb_heads();
    a->span->set_host_ratios(std::vector<double>(p, p + K));
    p += K;
  }
}

torch::Tensor XlModelImpl::nll(const torch::Tensor& hidden, const torch::Tensor& targets) const {
  const int64_t B = hidden.size(0), M = hidden.size(1);
  return crit->nll(hidden.reshape({B * M, -1}), targets.reshape({B * M})).view({B, M});
}

torch::Tensor XlModelImpl::log_prob(const torch::Tensor& hidden) const {
  const int64_t B = hidden.size(0), M = hidden.size(1);
  return crit->log_prob(hidden.reshape({B * M, -1})).view({B, M, -1});
}

torch::Tensor XlModelImpl::sample_weights(double tau, bool hard) const {
  return nn::gumbel_softmax(alpha, tau, hard);
}

torch::Tensor XlModelImpl::eval_weights() const {
  torch::NoGradGuard no_grad;
  return config_.search_eval == SearchEval::kArgmax ? nn::one_hot_argmax(alpha) : torch::softmax(alpha, -1);
}

torch::Tensor XlModelImpl::probs() const { return torch::softmax(alpha.detach(), -1); }

torch::Tensor XlModelImpl::span_loss() const {
  auto total = torch::zeros({}, word_emb->tables[0].options());
  for (const auto& a : attn)
    if (a && a->span) total = total + a->span->loss();
  return total;
}

void XlModelImpl::clamp_spans() {
  for (auto& a : attn)
    if (a && a->span) a->span->clamp_();
}

std::vector<std::vector<double>> XlModelImpl::spans() const {
  std::vector<std::vector<double>> out;
  for (const auto& a : attn) {
    if (!a || !a->span) continue;
    auto z = (a->span->span_ratio.detach() * static_cast<double>(a->span->options().attn_span())).to(torch::kCPU, torch::kDouble);
    out.emplace_back(z.data_ptr<double>(), z.data_ptr<double>() + z.numel());
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> XlModelImpl::weight_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : named_parameters())
    if (item.key() != "alpha") out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> XlModelImpl::arch_parameters() const {
  if (!alpha.defined()) return {};
  return {{"alpha", alpha}};
}

}  // namespace spanformer::models::xl
