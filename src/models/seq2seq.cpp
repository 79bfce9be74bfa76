#include "spanformer/models/seq2seq.h"

#include <torch/nn/init.h>
#include <torch/nn/utils/rnn.h>

#include <cmath>

#include "spanformer/nn/positional.h"
#include "spanformer/util/error.h"

namespace spanformer::models {

void DecodeState::reorder(const torch::Tensor& index) {
  for (auto& t : tensors) t = t.index_select(0, index.to(t.device()));
}

Seq2SeqNet make_seq2seq(const Seq2SeqModelConfig& config) {
  if (config.vocab_size <= 0 || config.target_vocab <= 0) fail("seq2seq: the vocabulary sizes are not set (open the data first)");
  Seq2SeqNet net;
  if (config.recurrent()) {
    auto m = std::make_shared<RnnSeq2SeqImpl>(config);
    net.model = m.get();
    net.module = m;
  } else {
    auto m = std::make_shared<TransformerSeq2SeqImpl>(config);
    net.model = m.get();
    net.module = m;
  }
  return net;
}

// ---- recurrent ------------------------------------------------------------------------------------

RnnSeq2SeqImpl::RnnSeq2SeqImpl(const Seq2SeqModelConfig& c) : config_(c) {
  const int64_t H = c.d_model, L = c.n_layer, V = c.vocab_size, Vt = c.target_vocab;
  src_embed = register_module("src_embed", torch::nn::Embedding(V, H));
  if (!c.share_embeddings) tgt_embed = register_module("tgt_embed", torch::nn::Embedding(Vt, H));
  auto gru = [&](int64_t input, int64_t hidden, bool both_ways) {
    return torch::nn::GRU(torch::nn::GRUOptions(input, hidden).num_layers(L).dropout(L > 1 ? c.dropout : 0.0).batch_first(true).bidirectional(both_ways));
  };
  encoder = register_module("encoder", c.bidirectional ? gru(H, H / 2, true) : gru(H, H, false));
  const bool feeds = c.kind == Seq2SeqKind::kGru || c.kind == Seq2SeqKind::kBahdanau ||
                     (c.kind == Seq2SeqKind::kLuong && c.input_feeding);
  decoder = register_module("decoder", gru(feeds ? 2 * H : H, H, false));
  if (c.kind == Seq2SeqKind::kBahdanau) {
    attention::ScoringOptions o;
    o.kind = attention::ScoreKind::kAdditive;
    o.query_size = o.key_size = o.hidden = H;
    attn = register_module("attn", attention::AttentionScoring(o));
    if (c.deep_output) deep = register_module("deep", spanformer::nn::Linear(3 * H, 2 * H));
  } else if (c.kind == Seq2SeqKind::kLuong) {
    attention::ScoringOptions o;
    o.kind = c.score;
    o.query_size = o.key_size = H;
    attn = register_module("attn", attention::AttentionScoring(o));
    combine = register_module("combine", spanformer::nn::Linear(torch::nn::LinearOptions(2 * H, H).bias(false)));
  }
  if (c.share_embeddings)
    out_bias = register_parameter("out_bias", torch::zeros({Vt}));
  else
    out = register_module("out", spanformer::nn::Linear(H, Vt));
  drop = register_module("drop", spanformer::nn::Dropout(c.dropout));
}

torch::Tensor RnnSeq2SeqImpl::embed_target(const torch::Tensor& y) {
  return config_.share_embeddings ? torch::embedding(src_embed->weight.narrow(0, 0, config_.target_vocab), y)
                                  : tgt_embed->forward(y);  // (B, T, H)
}

torch::Tensor RnnSeq2SeqImpl::output_logits(const torch::Tensor& h) {
  if (!config_.share_embeddings) return out->forward(h);
  return torch::matmul(h, src_embed->weight.narrow(0, 0, config_.target_vocab).t()) + out_bias;  // (..., Vt)
}

DecodeState RnnSeq2SeqImpl::start(const torch::Tensor& src, const torch::Tensor& src_len) {
  const int64_t B = src.size(0), S = src.size(1), H = config_.d_model;
  auto x = drop->forward(src_embed->forward(src));  // (B, S, H)
  auto packed = torch::nn::utils::rnn::pack_padded_sequence(x, src_len.cpu(), /*batch_first=*/true, /*enforce_sorted=*/false);
  auto [packed_out, h] = encoder->forward_with_packed_input(packed);  // h (L, B, H), bidirectional (2L, B, H/2)
  auto memory = std::get<0>(torch::nn::utils::rnn::pad_packed_sequence(packed_out, /*batch_first=*/true, 0.0, S));  // (B, S, H)
  if (config_.bidirectional)  // layer l's [forward state after x_n; backward state after x_1]
    h = h.view({config_.n_layer, 2, B, H / 2}).permute({0, 2, 1, 3}).reshape({config_.n_layer, B, H});  // (L, B, H)
  torch::Tensor feed = config_.kind == Seq2SeqKind::kGru ? h[-1] : torch::zeros({B, H}, x.options());  // (B, H)
  return DecodeState{{h.transpose(0, 1).contiguous(), memory, src_len, feed}};
}

torch::Tensor RnnSeq2SeqImpl::decode_step(const torch::Tensor& e, torch::Tensor& s, torch::Tensor& feed,
                                          const torch::Tensor& memory, const torch::Tensor& src_len, torch::Tensor* weights) {
  const auto kind = config_.kind;
  torch::Tensor input = e;  // (B, H) or (B, 2H)
  torch::Tensor deep_in;    // bahdanau with deep_output: [s_{t-1}; e; c_t] (B, 3H)
  if (kind == Seq2SeqKind::kGru) {
    input = torch::cat({e, feed}, 1);
  } else if (kind == Seq2SeqKind::kBahdanau) {
    auto [c, a] = attn->forward(s[-1].unsqueeze(1), memory, memory, src_len);  // (B, 1, H), (B, 1, S)
    input = torch::cat({e, c.squeeze(1)}, 1);
    if (deep) deep_in = torch::cat({s[-1], e, c.squeeze(1)}, 1);
    if (weights) *weights = a.squeeze(1);
  } else if (config_.input_feeding) {
    input = torch::cat({e, feed}, 1);
  }
  auto [o, s_next] = decoder->forward(input.unsqueeze(1), s);  // (B, 1, H), (L, B, H)
  s = s_next;
  auto h = o.squeeze(1);  // (B, H)
  if (kind == Seq2SeqKind::kLuong) {
    auto [c, a] = attn->forward(h.unsqueeze(1), memory, memory, src_len);  // (B, 1, H), (B, 1, S)
    h = torch::tanh(combine->forward(torch::cat({c.squeeze(1), h}, 1)));   // h~ (B, H)
    feed = h;
    if (weights) *weights = a.squeeze(1);
  }
  if (deep_in.defined()) h = std::get<0>(deep->forward(deep_in).unflatten(1, {-1, 2}).max(2));  // maxout: (B, 2H) -> (B, H)
  if (kind == Seq2SeqKind::kGru && weights) *weights = torch::zeros({e.size(0), memory.size(1)}, e.options());
  return output_logits(drop->forward(h));  // (B, Vt)
}

torch::Tensor RnnSeq2SeqImpl::translate_logits(const torch::Tensor& src, const torch::Tensor& src_len,
                                               const torch::Tensor& tgt_in, std::vector<torch::Tensor>* attention) {
  auto state = start(src, src_len);
  auto s = state.tensors[0].transpose(0, 1).contiguous();  // (L, B, H)
  const auto& memory = state.tensors[1];
  auto feed = state.tensors[3];
  auto e = drop->forward(embed_target(tgt_in));  // (B, T, H)
  const int64_t T = tgt_in.size(1);
  if (config_.kind == Seq2SeqKind::kGru) {  // no attention: the whole target in one GRU call
    auto input = torch::cat({e, feed.unsqueeze(1).expand({-1, T, -1})}, 2);  // (B, T, 2H)
    auto o = std::get<0>(decoder->forward(input, s));                        // (B, T, H)
    return output_logits(drop->forward(o));                                   // (B, T, Vt)
  }
  std::vector<torch::Tensor> logits, weights;
  for (int64_t t = 0; t < T; ++t) {
    torch::Tensor a;
    logits.push_back(decode_step(e.select(1, t), s, feed, memory, src_len, attention ? &a : nullptr));
    if (attention) weights.push_back(a);
  }
  if (attention) attention->push_back(torch::stack(weights, 1));  // (B, T, S)
  return torch::stack(logits, 1);                                  // (B, T, Vt)
}

torch::Tensor RnnSeq2SeqImpl::step(DecodeState& state, const torch::Tensor& prev, torch::Tensor* attention) {
  auto s = state.tensors[0].transpose(0, 1).contiguous();  // (L, B, H)
  auto e = drop->forward(embed_target(prev));             // (B, H)
  auto logits = decode_step(e, s, state.tensors[3], state.tensors[1], state.tensors[2], attention);
  state.tensors[0] = s.transpose(0, 1).contiguous();
  return torch::log_softmax(logits, -1);  // (B, Vt)
}

// ---- Transformer ----------------------------------------------------------------------------------

TransformerLayerImpl::TransformerLayerImpl(TransformerLayerOptions options) : pre_norm_(options.pre_norm()) {
  const auto& o = options.attention();
  const int64_t H = o.d_model;
  self_attn = register_module("self_attn", attention::MultiHeadAttention(o));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  if (options.decoder()) {
    cross_attn = register_module("cross_attn", attention::MultiHeadAttention(o));
    norm3 = register_module("norm3", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  }
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  fc1 = register_module("fc1", spanformer::nn::Linear(H, options.d_inner()));
  fc2 = register_module("fc2", spanformer::nn::Linear(options.d_inner(), H));
  drop = register_module("drop", spanformer::nn::Dropout(options.dropout()));
}

torch::Tensor TransformerLayerImpl::sublayer(const torch::Tensor& x, torch::nn::LayerNorm& norm,
                                             const std::function<torch::Tensor(const torch::Tensor&)>& f) {
  if (pre_norm_) return x + drop->forward(f(norm->forward(x)));
  return norm->forward(x + drop->forward(f(x)));
}

torch::Tensor TransformerLayerImpl::forward(const torch::Tensor& x, const attention::AttentionMask& self_mask,
                                            const torch::Tensor& memory, const attention::AttentionMask& memory_mask,
                                            torch::Tensor* weights) {
  auto h = sublayer(x, norm1, [&](const torch::Tensor& y) { return self_attn->forward(y, y, self_mask); });  // (B, N, H)
  if (cross_attn)
    h = sublayer(h, norm3, [&](const torch::Tensor& y) { return cross_attn->forward(y, memory, memory_mask, weights); });
  return sublayer(h, norm2, [&](const torch::Tensor& y) {
    return fc2->forward(drop->forward(torch::relu(fc1->forward(y))));  // (B, N, H)
  });
}

TransformerSeq2SeqImpl::TransformerSeq2SeqImpl(const Seq2SeqModelConfig& c) : config_(c) {
  const int64_t H = c.d_model;
  src_embed = register_module("src_embed", torch::nn::Embedding(c.vocab_size, H));
  if (!c.share_embeddings) tgt_embed = register_module("tgt_embed", torch::nn::Embedding(c.target_vocab, H));
  encoder = register_module("encoder", torch::nn::ModuleList());
  decoder = register_module("decoder", torch::nn::ModuleList());
  const auto layer = TransformerLayerOptions({H, c.n_head, 0, c.dropout, true}, c.inner_dim()).dropout(c.dropout).pre_norm(c.pre_norm);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    enc_layers_.push_back(TransformerLayer(layer));
    encoder->push_back(enc_layers_.back());
    dec_layers_.push_back(TransformerLayer(TransformerLayerOptions(layer).decoder(true)));
    decoder->push_back(dec_layers_.back());
  }
  if (c.pre_norm) {
    enc_norm = register_module("enc_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
    dec_norm = register_module("dec_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  }
  if (c.share_embeddings)
    out_bias = register_parameter("out_bias", torch::zeros({c.target_vocab}));
  else
    out = register_module("out", spanformer::nn::Linear(H, c.target_vocab));
  drop = register_module("drop", spanformer::nn::Dropout(c.dropout));
  positions = register_buffer("positions", nn::sinusoidal_positions(c.max_positions, H));

  // Initialisation as in the common reference implementations (fairseq, tensor2tensor): Xavier-uniform
  // matrices, zero biases, embeddings N(0, H^-1/2) (they are scaled by sqrt(H) on the way in).
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const auto& name = p.key();
    auto& w = p.value();
    if (name.find("embed") != std::string::npos)
      w.normal_(0, 1 / std::sqrt(static_cast<double>(H)));
    else if (w.dim() >= 2)
      torch::nn::init::xavier_uniform_(w);
    else if (name.find("norm") == std::string::npos)
      w.zero_();
  }
}

torch::Tensor TransformerSeq2SeqImpl::embed(const torch::Tensor& ids, torch::nn::Embedding& table) {
  const int64_t N = ids.size(1);
  if (N > config_.max_positions) fail("seq2seq: a sequence of {} tokens is longer than max_positions {}", N, config_.max_positions);
  auto e = (table ? table->forward(ids) : torch::embedding(src_embed->weight.narrow(0, 0, config_.target_vocab), ids)) *
           std::sqrt(static_cast<double>(config_.d_model));      // (B, N, H)
  return drop->forward(e + positions.narrow(0, 0, N).to(e.dtype()));  // (B, N, H)
}

torch::Tensor TransformerSeq2SeqImpl::encode(const torch::Tensor& src, const torch::Tensor& src_len) {
  auto x = embed(src, src_embed);  // (B, S, H)
  attention::AttentionMask mask;
  mask.valid = src_len;
  for (auto& layer : enc_layers_) x = layer->forward(x, mask);
  return config_.pre_norm ? enc_norm->forward(x) : x;  // (B, S, H)
}

torch::Tensor TransformerSeq2SeqImpl::decode(const torch::Tensor& tgt_in, const torch::Tensor& memory,
                                             const torch::Tensor& src_len, std::vector<torch::Tensor>* attention) {
  torch::nn::Embedding none{nullptr};
  auto x = embed(tgt_in, config_.share_embeddings ? none : tgt_embed);  // (B, T, H)
  attention::AttentionMask self_mask, memory_mask;
  self_mask.causal = true;
  memory_mask.valid = src_len;
  for (auto& layer : dec_layers_) {
    torch::Tensor w;
    x = layer->forward(x, self_mask, memory, memory_mask, attention ? &w : nullptr);
    if (attention) attention->push_back(w);  // (B, K, T, S)
  }
  if (config_.pre_norm) x = dec_norm->forward(x);
  if (!config_.share_embeddings) return out->forward(x);  // (B, T, Vt)
  return torch::matmul(x, src_embed->weight.narrow(0, 0, config_.target_vocab).t()) + out_bias;
}

torch::Tensor TransformerSeq2SeqImpl::translate_logits(const torch::Tensor& src, const torch::Tensor& src_len,
                                                       const torch::Tensor& tgt_in, std::vector<torch::Tensor>* attention) {
  return decode(tgt_in, encode(src, src_len), src_len, attention);
}

DecodeState TransformerSeq2SeqImpl::start(const torch::Tensor& src, const torch::Tensor& src_len) {
  auto memory = encode(src, src_len);  // (B, S, H)
  return DecodeState{{memory, src_len, torch::empty({src.size(0), 0}, src.options())}};
}

torch::Tensor TransformerSeq2SeqImpl::step(DecodeState& state, const torch::Tensor& prev, torch::Tensor* attention) {
  auto& prefix = state.tensors[2];
  prefix = torch::cat({prefix, prev.unsqueeze(1).to(prefix.dtype())}, 1);  // (B, t)
  std::vector<torch::Tensor> weights;
  auto logits = decode(prefix, state.tensors[0], state.tensors[1], attention ? &weights : nullptr);  // (B, t, Vt)
  if (attention) {
    auto w = torch::stack(weights, 0).select(3, prefix.size(1) - 1);  // (L, B, K, S)
    *attention = w.mean(2).mean(0);                                   // (B, S)
  }
  return torch::log_softmax(logits.select(1, prefix.size(1) - 1), -1);  // (B, Vt)
}

// ---- decoding -------------------------------------------------------------------------------------

namespace {

// The next token's log-probabilities (n, Vt) on the host; <pad> and <bos> are never emitted.
torch::Tensor next_logprobs(Seq2SeqModel& model, DecodeState& state, const torch::Tensor& prev, torch::Tensor& attention) {
  auto logp = model.step(state, prev, &attention).to(torch::kDouble).cpu();  // (n, Vt)
  logp.select(1, data::kPadId).fill_(-INFINITY);
  logp.select(1, data::kBosId).fill_(-INFINITY);
  attention = attention.to(torch::kDouble).cpu();  // (n, S)
  return logp;
}

double length_normalised(double logprob, int64_t n, double alpha) {
  return alpha == 0 ? logprob : logprob / std::pow((5.0 + static_cast<double>(n)) / 6.0, alpha);
}

std::vector<Hypothesis> greedy(Seq2SeqModel& model, const torch::Tensor& src, const torch::Tensor& src_len,
                               const DecodeOptions& o) {
  const int64_t B = src.size(0);
  auto state = model.start(src, src_len);
  auto prev = torch::full({B}, data::kBosId, src.options());
  auto lens = src_len.cpu();
  std::vector<Hypothesis> out(static_cast<size_t>(B));
  std::vector<std::vector<torch::Tensor>> attn(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, lens[b].item<int64_t>() + o.max_extra);
  for (int64_t t = 0; t < max_len; ++t) {
    torch::Tensor a;
    auto logp = next_logprobs(model, state, prev, a);  // (B, Vt)
    auto best = std::get<1>(logp.max(-1));            // (B)
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      auto& h = out[static_cast<size_t>(b)];
      if (done[static_cast<size_t>(b)]) continue;
      const int64_t y = best[b].item<int64_t>();
      h.logprob += logp[b][y].item<double>();
      attn[static_cast<size_t>(b)].push_back(a[b]);
      if (y == data::kEosId || t + 1 >= lens[b].item<int64_t>() + o.max_extra) {
        done[static_cast<size_t>(b)] = true;
        if (y != data::kEosId) h.tokens.push_back(y);
      } else {
        h.tokens.push_back(y);
        all_done = false;
      }
    }
    if (all_done) break;
    prev = best.to(src.device());
  }
  for (int64_t b = 0; b < B; ++b) {
    auto& h = out[static_cast<size_t>(b)];
    h.score = length_normalised(h.logprob, static_cast<int64_t>(h.tokens.size()) + 1, o.length_penalty);
    h.attention = torch::stack(attn[static_cast<size_t>(b)], 0);  // (n, S)
  }
  return out;
}

// Beam search for one sentence (1, S): `beam` live hypotheses as one batch.
Hypothesis beam_search(Seq2SeqModel& model, const torch::Tensor& src, const torch::Tensor& src_len, const DecodeOptions& o) {
  const int64_t K = o.beam, max_len = src_len.cpu()[0].item<int64_t>() + o.max_extra;
  auto state = model.start(src, src_len);
  struct Live {
    std::vector<int64_t> tokens;
    std::vector<torch::Tensor> attn;
    double logprob = 0;
  };
  std::vector<Live> live(1);
  std::vector<Hypothesis> finished;
  auto prev = torch::full({1}, data::kBosId, src.options());
  for (int64_t t = 0; t < max_len && !live.empty(); ++t) {
    torch::Tensor a;
    auto logp = next_logprobs(model, state, prev, a);  // (n, Vt)
    const int64_t n = logp.size(0), Vt = logp.size(1);
    auto total = logp + torch::tensor(std::vector<double>([&] {
                          std::vector<double> v;
                          for (const auto& l : live) v.push_back(l.logprob);
                          return v;
                        }()), torch::kDouble).unsqueeze(1);  // (n, Vt)
    auto [values, index] = total.reshape({-1}).topk(std::min<int64_t>(2 * K, n * Vt));
    std::vector<Live> next;
    std::vector<int64_t> parents, tokens;
    for (int64_t i = 0; i < values.size(0) && static_cast<int64_t>(next.size()) < K; ++i) {
      const int64_t flat = index[i].item<int64_t>(), parent = flat / Vt, y = flat % Vt;
      Live l{live[static_cast<size_t>(parent)].tokens, live[static_cast<size_t>(parent)].attn, values[i].item<double>()};
      l.attn.push_back(a[parent]);
      if (y == data::kEosId || t + 1 >= max_len) {
        if (y != data::kEosId) l.tokens.push_back(y);
        Hypothesis h{l.tokens, l.logprob, 0, torch::stack(l.attn, 0)};
        h.score = length_normalised(h.logprob, static_cast<int64_t>(h.tokens.size()) + 1, o.length_penalty);
        finished.push_back(std::move(h));
        continue;
      }
      l.tokens.push_back(y);
      next.push_back(std::move(l));
      parents.push_back(parent);
      tokens.push_back(y);
    }
    // Stop when K hypotheses have finished and the best live one already scores below the worst of them.
    if (static_cast<int64_t>(finished.size()) >= K && !next.empty()) {
      double worst = finished[0].score;
      for (const auto& h : finished) worst = std::min(worst, h.score);
      const double best_live =
          length_normalised(next[0].logprob, static_cast<int64_t>(next[0].tokens.size()) + 1, o.length_penalty);
      if (best_live < worst) next.clear();
    }
    live = std::move(next);
    if (live.empty()) break;
    state.reorder(torch::tensor(parents, torch::kLong));
    prev = torch::tensor(tokens, torch::kLong).to(src.device());
  }
  const Hypothesis* best = nullptr;
  for (const auto& h : finished)
    if (!best || h.score > best->score) best = &h;
  if (!best) fail("beam search: no hypothesis finished");  // unreachable: the length limit finishes every beam
  return *best;
}

}  // namespace

std::vector<Hypothesis> decode(Seq2SeqModel& model, const torch::Tensor& src, const torch::Tensor& src_len,
                               const DecodeOptions& o) {
  if (src.dim() != 2 || src_len.dim() != 1 || src_len.size(0) != src.size(0))
    fail("decode: expected src (B, S) and src_len (B) (got {} and {} dimensions)", src.dim(), src_len.dim());
  if (o.beam < 1) fail("decode: beam must be positive (got {})", o.beam);
  torch::NoGradGuard no_grad;
  if (o.beam == 1) return greedy(model, src, src_len, o);
  std::vector<Hypothesis> out;
  for (int64_t b = 0; b < src.size(0); ++b) {
    const int64_t n = src_len.cpu()[b].item<int64_t>();
    out.push_back(beam_search(model, src.narrow(0, b, 1).narrow(1, 0, n), src_len.narrow(0, b, 1), o));
  }
  return out;
}

}  // namespace spanformer::models
