// The seq2seq family on the one engine: translation of sentence pairs (data/pairs.h) by the
// models of models/seq2seq.h, with the Runner's example data (ExampleSets, train/family.h).
//
// Batches: each epoch's permutation (drawn from (seed, epoch)) is cut into pools of 32 batches; each
// pool is sorted by (source, target) length and its batches are shuffled again (length buckets: little
// padding, still random), all from the epoch's generator, so a resumed run reads the same batches.
// A batch is x = source ids (b, S) and y = <bos> target <eos> (b, T + 1), padded with <pad> (id 0, which
// no real token has: lengths are the non-pad counts).
//
// Train step: teacher forcing, cross-entropy over the target tokens with label smoothing (the logged
// train figure is the unsmoothed NLL per target token), batch_split groups, gradients averaged over
// processes, the shared optimizer and schedule (default: Adam, warmup + inverse square root).
// Validation: NLL per target token and token accuracy under teacher forcing, plus BLEU of greedy
// translations of the valid split. `eval` scores the test split the same way with beam search
// (model.beam, model.length_penalty), BLEU against the normalised references (metrics/bleu.h, 13a).
#include "train/families/families.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "spanformer/util/precision.h"
#include "spanformer/config/seq2seq_config.h"
#include "spanformer/data/pairs.h"
#include "spanformer/metrics/bleu.h"
#include "spanformer/models/seq2seq.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"
#include "spanformer/viz/heatmap.h"

namespace spanformer::train {
namespace {

using data::SentencePair;

// Padded id matrix of sequences: (n, longest) int64, <pad> = 0.
torch::Tensor pad_rows(const std::vector<std::vector<int64_t>>& rows) {
  size_t width = 1;
  for (const auto& r : rows) width = std::max(width, r.size());
  auto out = torch::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, torch::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].begin(), rows[i].end(), p + i * width);
  return out;
}

torch::Tensor lengths_of(const torch::Tensor& ids) { return ids.ne(data::kPadId).sum(1); }  // (b) int64

class Seq2SeqFamily : public ConfiguredFamily<Seq2SeqConfig>,
                  public ExampleSets,
                  public Translation,
                  public AttentionPictures {
 public:
  using ConfiguredFamily::ConfiguredFamily;

  const char* name() const override { return "seq2seq"; }
  void set_vocab_size(int64_t V, const std::string& origin) override { fill_vocab_size(config_.model.vocab_size, V, origin); }
  std::string model_difference(const nlohmann::json& checkpoint_config) const override {
    return spanformer::model_difference(config_, seq2seq_config_from_json(checkpoint_config, "checkpoint"));
  }

  void build() override { net_ = models::make_seq2seq(config_.model); }
  torch::nn::Module& module() override { return *net_.module; }

  ExampleData open_examples(const std::string& path) override {
    data_ = std::make_unique<data::PairSet>(data::load_pairs(path, config_.data));
    set_vocab_size(data_->vocab.size(), path);
    fill_vocab_size(config_.model.target_vocab, data_->target_vocab, path + " (target side)");
    if (!config_.model.recurrent()) {  // subwords can outnumber the words max_length counts
      size_t longest = 0;
      for (const auto* split : {&data_->train, &data_->valid, &data_->test})
        for (const auto& p : *split) longest = std::max({longest, p.src.size(), p.tgt.size()});
      if (static_cast<int64_t>(longest) + 2 > config_.model.max_positions)
        fail("{}: a sentence of {} tokens (+ <bos>/<eos>) exceeds model.max_positions {}", path, longest,
             config_.model.max_positions);
    }
    ExampleData out;
    out.vocab = data_->vocab;
    out.train_size = static_cast<int64_t>(data_->train.size());
    out.valid_size = static_cast<int64_t>(data_->valid.size());
    out.train_fingerprint = out.valid_fingerprint = data_->fingerprint;
    out.item = "pairs";
    out.scored = "target_tokens";
    return out;
  }

  void arrange_epoch(torch::Tensor& order, int64_t batch, at::Generator& generator) override {
    const int64_t n = order.size(0), pool = 32 * batch;
    auto* o = order.data_ptr<int64_t>();
    const auto& train = data_->train;
    auto length = [&](int64_t i) {
      const auto& p = train[static_cast<size_t>(i)];
      return std::pair{p.src.size(), p.tgt.size()};
    };
    for (int64_t begin = 0; begin < n; begin += pool) {
      const int64_t end = std::min(n, begin + pool), batches = (end - begin) / batch;
      std::stable_sort(o + begin, o + end, [&](int64_t a, int64_t b) { return length(a) < length(b); });
      if (batches < 2) continue;
      auto shuffle = torch::randperm(batches, generator, torch::kLong);
      std::vector<int64_t> copy(o + begin, o + begin + batches * batch);
      for (int64_t k = 0; k < batches; ++k)
        std::copy_n(copy.begin() + shuffle[k].item<int64_t>() * batch, batch, o + begin + k * batch);
    }
  }

  std::pair<torch::Tensor, torch::Tensor> example_batch(const std::vector<int64_t>& ids, torch::Device device) override {
    std::vector<std::vector<int64_t>> src, tgt;
    for (int64_t i : ids) {
      const auto& p = data_->train[static_cast<size_t>(i)];
      src.push_back(p.src);
      tgt.push_back(with_markers(p.tgt));
    }
    return {pad_rows(src).to(device), pad_rows(tgt).to(device)};  // (b, S), (b, T + 1)
  }

  torch::Tensor train_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) override {
    net_.module->train();
    optimizer_->zero_grad();
    std::vector<torch::Tensor> no_state;
    const int64_t Vt = config_.model.target_vocab;
    auto loss = accumulate_gradients(
        x.size(0), config_.train.batch_split, no_state, ctx, net_.module->parameters(),
        [&](int64_t first, int64_t count, std::vector<torch::Tensor>&) {
          auto src = x.narrow(0, first, count), tgt = y.narrow(0, first, count);  // (b, S), (b, T + 1)
          auto logits = net_.model->translate_logits(src, lengths_of(src), tgt.narrow(1, 0, tgt.size(1) - 1));  // (b, T, Vt)
          auto flat = widen_reduced(logits).reshape({-1, Vt});
          auto gold = tgt.narrow(1, 1, tgt.size(1) - 1).reshape({-1});  // (b T)
          auto smoothed = at::cross_entropy_loss(flat, gold, {}, at::Reduction::Mean, data::kPadId, config_.model.label_smoothing);
          torch::Tensor nll;
          {
            torch::NoGradGuard no_grad;
            nll = at::cross_entropy_loss(flat, gold, {}, at::Reduction::Mean, data::kPadId, 0.0);
          }
          return std::pair{nll, smoothed};
        });
    optimizer_->step(ctx.lr);
    interval_tokens_ += static_cast<double>(y.narrow(1, 1, y.size(1) - 1).ne(data::kPadId).sum().item<int64_t>());
    ++interval_steps_;
    return loss;
  }

  ExampleScore score_examples(const std::string& split_name, int64_t part, int64_t parts, bool full) override {
    if (!data_) fail("seq2seq: no pairs file is open");
    const auto& split = data_->split(split_name);
    const auto n = static_cast<int64_t>(split.size());
    const int64_t begin = part * n / parts, end = (part + 1) * n / parts;
    const int64_t batch = config_.train.eval_batch_size;
    const auto options = decode_options(full ? TranslateRequest{} : TranslateRequest{1, -1});
    torch::NoGradGuard no_grad;
    net_.module->eval();
    ExampleScore score;
    std::vector<std::string> hyps, refs;
    const int64_t Vt = config_.model.target_vocab;
    for (int64_t i = begin; i < end; i += batch) {
      const int64_t b = std::min(batch, end - i);
      std::vector<std::vector<int64_t>> src, tgt;
      for (int64_t k = i; k < i + b; ++k) {
        src.push_back(split[static_cast<size_t>(k)].src);
        tgt.push_back(with_markers(split[static_cast<size_t>(k)].tgt));
        refs.push_back(split[static_cast<size_t>(k)].target);
      }
      auto x = pad_rows(src).to(device()), y = pad_rows(tgt).to(device());  // (b, S), (b, T + 1)
      auto src_len = lengths_of(x);
      auto logits = net_.model->translate_logits(x, src_len, y.narrow(1, 0, y.size(1) - 1)).to(torch::kDouble);  // (b, T, Vt)
      auto gold = y.narrow(1, 1, y.size(1) - 1).reshape({-1});
      auto flat = logits.reshape({-1, Vt});
      auto mask = gold.ne(data::kPadId);
      score.nll_sum += at::cross_entropy_loss(flat, gold, {}, at::Reduction::Sum, data::kPadId, 0.0).item<double>();
      score.correct += flat.argmax(-1).eq(gold).logical_and(mask).sum().item<double>();
      score.count += mask.sum().item<double>();
      for (auto& h : models::decode(*net_.model, x, src_len, options))
        hyps.push_back(data::decode_sentence(h.tokens, data_->vocab));
    }
    net_.module->train();
    auto bleu = metrics::corpus_bleu(hyps, {refs});
    if (full)
      for (size_t k = 0; k < hyps.size(); ++k) score.outputs.push_back(refs[k] + "\t" + hyps[k]);
    score.bleu = bleu.stats;
    if (full) fmt::print(stderr, "{}: {} pairs translated (beam {})\n", split_name, hyps.size(), options.beam);
    return score;
  }

  void report_score(const ExampleScore& score, const std::string& prefix, nlohmann::json& record, std::string& text) override {
    if (!score.bleu) return;
    const auto bleu = metrics::bleu_from_stats(*score.bleu);
    record[prefix + "bleu"] = bleu.score;
    record[prefix + "bleu_text"] = bleu.text();
    text += fmt::format(" | {}BLEU {:.2f}", prefix.empty() ? "" : "valid ", bleu.score);
    if (prefix == "valid_" && interval_steps_ > 0 && record.contains("ms_per_step")) {
      const double per_s = interval_tokens_ / (static_cast<double>(interval_steps_) * record["ms_per_step"].get<double>() / 1e3);
      record["target_tokens_per_s"] = per_s;
      text += fmt::format(" | {:.0f} tgt tok/s", per_s);
      interval_tokens_ = 0;
      interval_steps_ = 0;
    }
  }

  std::vector<std::string> translate(const std::vector<std::string>& sentences, const TranslateRequest& request) override {
    const auto options = decode_options(request);
    std::vector<std::string> out;
    torch::NoGradGuard no_grad;
    net_.module->eval();
    const int64_t batch = options.beam == 1 ? config_.train.eval_batch_size : 1;
    for (size_t i = 0; i < sentences.size(); i += static_cast<size_t>(batch)) {
      std::vector<std::vector<int64_t>> src;
      for (size_t k = i; k < std::min(sentences.size(), i + static_cast<size_t>(batch)); ++k) src.push_back(source_ids(sentences[k]));
      auto x = pad_rows(src).to(device());
      for (auto& h : models::decode(*net_.model, x, lengths_of(x), options))
        out.push_back(data::decode_sentence(h.tokens, vocab()));
    }
    return out;
  }

  void draw_attention(const AttentionRequest& r) override {
    std::vector<std::string> sources, references;
    if (!r.texts.empty()) {
      sources = r.texts;
    } else {
      if (r.indices.empty()) fail("attention: name sentences with --text, or pairs of --split with --pair");
      if (!data_) open_examples(config_.train.data);
      const auto& split = data_->split(r.split);
      for (int64_t i : r.indices) {
        if (i < 0 || i >= static_cast<int64_t>(split.size()))
          fail("attention: pair {} is outside the {} split (0 .. {})", i, r.split, split.size() - 1);
        sources.push_back(split[static_cast<size_t>(i)].source);
        references.push_back(split[static_cast<size_t>(i)].target);
      }
    }
    const bool transformer = !config_.model.recurrent();
    if (config_.model.kind == Seq2SeqKind::kGru) fail("attention: the gru model has no attention (kind gru); train bahdanau, luong or transformer");
    if (r.layer >= config_.model.n_layer || r.layer < -1 || (!transformer && r.layer > 0))
      fail("attention: --layer must be in [0, {}) (got {})", transformer ? config_.model.n_layer : 1, r.layer);
    if (r.head >= config_.model.n_head || r.head < -1 || (!transformer && r.head > 0))
      fail("attention: --head must be in [0, {}) (got {})", transformer ? config_.model.n_head : 1, r.head);
    torch::NoGradGuard no_grad;
    net_.module->eval();
    const auto options = decode_options(TranslateRequest{});
    std::vector<viz::Heatmap> panels;
    for (size_t i = 0; i < sources.size(); ++i) {
      auto ids = source_ids(sources[i]);
      auto x = pad_rows({ids}).to(device());
      auto h = models::decode(*net_.model, x, lengths_of(x), options)[0];
      // Teacher-force the decoded output to read each layer's and head's weights.
      std::vector<int64_t> tgt_in{data::kBosId};
      tgt_in.insert(tgt_in.end(), h.tokens.begin(), h.tokens.end());
      std::vector<torch::Tensor> weights;
      net_.model->translate_logits(x, lengths_of(x), pad_rows({tgt_in}).to(device()), &weights);
      torch::Tensor a;  // (n, S)
      if (!transformer) {
        a = weights[0][0];
        if (r.weights) r.weights->push_back(a.to(torch::kDouble).cpu());
      } else {
        auto w = torch::stack(weights, 0).select(1, 0);  // (L, K, n, S)
        a = r.layer < 0 ? w.mean(1).mean(0) : r.head < 0 ? w[r.layer].mean(0) : w[r.layer][r.head];
        if (r.weights) r.weights->push_back(w.to(torch::kDouble).cpu());
      }
      if (r.out.empty()) continue;
      a = a.to(torch::kDouble).cpu().contiguous();
      viz::Heatmap p;
      for (int64_t row = 0; row < a.size(0); ++row) p.values.emplace_back(a[row].data_ptr<double>(), a[row].data_ptr<double>() + a.size(1));
      auto words = data::decode_ids(h.tokens, vocab());
      p.row_ticks = words;
      p.row_ticks.push_back("<eos>");
      for (int64_t id : ids) p.col_ticks.push_back(vocab().tokens[static_cast<size_t>(id)]);
      const std::string output = data::decode_sentence(h.tokens, vocab());
      p.title = fmt::format("{} -> {}", sources[i], output);
      p.row_label = "output";
      p.col_label = "source";
      fmt::print("{}\n  -> {}\n", sources[i], output);
      if (i < references.size()) fmt::print("  reference: {}\n", references[i]);
      panels.push_back(std::move(p));
    }
    if (!r.out.empty()) viz::write_heatmaps(r.out, panels);
  }

  void bench(const BenchRequest& r) override {
    if (r.mode == BenchMode::kGenerate) unsupported("bench --mode generate");
    auto& c = config_.model;
    if (c.vocab_size == 0) c.vocab_size = 16000;
    if (c.target_vocab == 0) c.target_vocab = 8000;
    validate();
    torch::manual_seed(config_.train.seed);
    build();
    net_.module->to(r.device);
    make_optimizers();
    const int64_t B = config_.train.batch_size, N = config_.data.max_length;
    const StepContext ctx = bench_context(config_.train, r.device);
    double first_loss = std::nan("");  // the mean NLL of the first step, before any update (nats)
    const double per_step = time_steps(r, [&] {
      auto x = torch::randint(4, c.vocab_size, {B, N}, torch::kLong).to(r.device);
      auto y = torch::randint(4, c.target_vocab, {B, N + 2}, torch::kLong).to(r.device);
      if (r.eval()) {
        torch::NoGradGuard no_grad;
        net_.module->eval();
        net_.model->translate_logits(x, lengths_of(x), y.narrow(1, 0, N + 1)).sum().item<double>();
      } else {
        const double loss = train_step(x, y, ctx).item<double>();
        if (std::isnan(first_loss)) first_loss = loss;
      }
    });
    const double target_tokens_per_s = static_cast<double>(B * (N + 1)) / per_step;
    report_bench(r, name(), "bench",
                 fmt::format("{}, {} {} layers, H {}, V {} / {}, B {} pairs of {} + {} tokens, threads {}",
                             r.eval() ? "eval forward" : "train step", seq2seq_kind_name(c.kind), c.n_layer, c.d_model,
                             c.vocab_size, c.target_vocab, B, N, N + 1, r.threads),
                 fmt::format("{:.1f} ms/step, {:.0f} target tokens/s", per_step * 1e3, target_tokens_per_s),
                 {{"mode", bench_mode_name(r.mode)}, {"ms_per_step", per_step * 1e3},
                  {"target_tokens_per_s", target_tokens_per_s}, {"kind", seq2seq_kind_name(c.kind)},
                  {"params", parameter_count(*net_.module)},
                  {"first_loss", r.eval() ? nlohmann::json() : nlohmann::json(first_loss)}});
  }

  void set_vocabulary(const data::Vocab& v) override { vocab_ = v; }

 private:
  torch::Device device() const { return net_.module->parameters().front().device(); }
  const data::Vocab& vocab() const {
    if (data_) return data_->vocab;
    if (vocab_.tokens.empty()) fail("seq2seq: no vocabulary (open the pairs file or read a checkpoint)");
    return vocab_;
  }

  static std::vector<int64_t> with_markers(const std::vector<int64_t>& ids) {
    std::vector<int64_t> out{data::kBosId};
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(data::kEosId);
    return out;
  }

  static std::string shorten(const std::string& sentence) {  // an error line shows the first 60 bytes
    return sentence.size() <= 60 ? sentence : sentence.substr(0, 60) + "...";
  }

  std::vector<int64_t> source_ids(const std::string& sentence) const {
    const std::string normalised = data::normalize_sentence(sentence, config_.data.lowercase);
    auto ids = data::encode_sentence(normalised, vocab());
    if (ids.empty()) fail("translate: the sentence '{}' has no words", sentence);
    // Every kind (the recurrent ones too: a 100,000-word line took 8 GB and half a minute) takes at most
    // max_positions tokens; a longer sentence is refused before any work, shown by its first words.
    if (static_cast<int64_t>(ids.size()) > config_.model.max_positions)
      fail("translate: '{}' has {} tokens, more than the model's max_positions {}", shorten(sentence), ids.size(),
           config_.model.max_positions);
    return ids;
  }

  // -1 in the request: the config's value. Any other value is the caller's (the command line, Python) and
  // is checked here, where every caller passes: a beam wider than the target vocabulary keeps beams that
  // can only repeat (and a beam of 10^6 would allocate beam x vocabulary scores per step).
  models::DecodeOptions decode_options(const TranslateRequest& r) const {
    if (r.beam != -1 && r.beam < 1) fail("beam must be positive (got {})", r.beam);
    if (r.length_penalty != -1 && !(r.length_penalty >= 0 && std::isfinite(r.length_penalty)))
      fail("length_penalty must be a finite number >= 0 (got {})", r.length_penalty);
    models::DecodeOptions o;
    o.beam = r.beam > 0 ? r.beam : config_.model.beam;
    if (o.beam > config_.model.target_vocab)
      fail("beam {} is wider than the target vocabulary ({} tokens)", o.beam, config_.model.target_vocab);
    o.length_penalty = r.length_penalty >= 0 ? r.length_penalty : config_.model.length_penalty;
    o.max_extra = config_.model.max_extra;
    return o;
  }

  models::Seq2SeqNet net_;
  std::unique_ptr<data::PairSet> data_;
  data::Vocab vocab_;
  double interval_tokens_ = 0;
  int64_t interval_steps_ = 0;
};

}  // namespace

std::vector<BenchSetting> seq2seq_bench_settings() {
  return {};
}

std::unique_ptr<Family> make_seq2seq_family(const nlohmann::json& config, const std::string& origin,
                                            const std::vector<std::string>& overrides) {
  return configured_family<Seq2SeqFamily>(seq2seq_config_from_json(config, origin), overrides);
}

}  // namespace spanformer::train
