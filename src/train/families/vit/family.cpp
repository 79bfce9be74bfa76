// The ViT family on the one engine: the Vision Transformer (models/vit.h) classifying the
// images of an IDX image set (data/idx.h), with the Runner's example data (ExampleSets, train/family.h):
// shuffled epochs drawn from (seed, epoch), so a resumed run reads the very batches an uninterrupted
// one would.
//
// Train step: the batch's images (B / processes), random translations when model.augment_shift > 0
// (torch's CPU generator, saved in checkpoints), batch_split groups each run forward, mean
// cross-entropy, backward, gradients averaged over processes, AdamW with the shared schedule and
// global clipping. Validation: the whole valid split (the last model.valid_images training images), mean NLL and
// accuracy. `spanformer eval` scores a split (test by default) the same way.
#include "train/families/families.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/functional/padding.h>

#include <cmath>

#include <fmt/format.h>

#include "spanformer/util/precision.h"
#include "spanformer/config/vit_config.h"
#include "spanformer/data/idx.h"
#include "spanformer/models/vit.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"
#include "spanformer/viz/heatmap.h"

namespace spanformer::train {
namespace {

using models::VitModel;

class VitFamily : public ConfiguredFamily<VitConfig>,
                  public ExampleSets,
                  public AttentionPictures {
 public:
  using ConfiguredFamily::ConfiguredFamily;

  const char* name() const override { return "vit"; }
  void set_vocab_size(int64_t V, const std::string& origin) override { fill_vocab_size(config_.model.classes, V, origin); }
  std::string model_difference(const nlohmann::json& checkpoint_config) const override {
    return spanformer::model_difference(config_, vit_config_from_json(checkpoint_config, "checkpoint"));
  }

  void build() override { model_ = VitModel(config_.model); }
  torch::nn::Module& module() override { return *model_; }

  ExampleData open_examples(const std::string& path) override {
    data_ = std::make_unique<data::ImageSet>(data::load_image_set(path, config_.model.valid_images));
    const auto& c = config_.model;
    const auto& images = data_->train.images;  // (n, S, S)
    if (images.size(1) != c.image_size || images.size(2) != c.image_size || c.channels != 1)
      fail("{}: images of {}x{} pixels, one channel; the config says image_size {} and channels {}", path,
           images.size(1), images.size(2), c.image_size, c.channels);
    ExampleData out;
    out.vocab.tokens = data_->classes;
    out.vocab.word_level = true;
    set_vocab_size(static_cast<int64_t>(data_->classes.size()), path);
    out.train_size = data_->train.images.size(0);
    out.valid_size = data_->valid.images.size(0);
    out.train_fingerprint = data_->train.fingerprint;
    out.valid_fingerprint = data_->valid.fingerprint;
    out.item = "images";
    out.scored = "images";
    return out;
  }

  std::pair<torch::Tensor, torch::Tensor> example_batch(const std::vector<int64_t>& ids, torch::Device device) override {
    auto index = torch::tensor(ids, torch::kLong);
    auto x = data_->train.images.index_select(0, index);  // (b, S, S) uint8
    auto y = data_->train.labels.index_select(0, index);  // (b)
    if (const int64_t s = config_.model.augment_shift; s > 0) x = translate(x, s);
    return {x.to(device), y.to(device)};
  }

  torch::Tensor train_step(const torch::Tensor& x, const torch::Tensor& y, const StepContext& ctx) override {
    model_->train();
    optimizer_->zero_grad();
    std::vector<torch::Tensor> no_state;
    auto loss = accumulate_gradients(x.size(0), config_.train.batch_split, no_state, ctx, model_->parameters(),
                                     [&](int64_t first, int64_t count, std::vector<torch::Tensor>&) {
                                       auto logits = widen_reduced(model_->forward(x.narrow(0, first, count)));  // (b, C)
                                       auto nll = torch::cross_entropy_loss(logits, y.narrow(0, first, count));
                                       return std::pair{nll, nll};
                                     });
    optimizer_->step(ctx.lr);
    return loss;
  }

  ExampleScore score_examples(const std::string& split_name, int64_t part, int64_t parts, bool full) override {
    if (!data_) fail("vit: no image set is open");
    const auto& split = data_->split(split_name);
    const int64_t n = split.images.size(0), begin = part * n / parts, end = (part + 1) * n / parts;
    const int64_t batch = config_.train.eval_batch_size;
    torch::NoGradGuard no_grad;
    model_->eval();
    ExampleScore score;
    for (int64_t i = begin; i < end; i += batch) {
      const int64_t b = std::min(batch, end - i);
      auto logits = model_->forward(split.images.narrow(0, i, b).to(device())).to(torch::kDouble);  // (b, C)
      auto y = split.labels.narrow(0, i, b).to(device());                                           // (b)
      score.nll_sum += torch::nll_loss(torch::log_softmax(logits, -1), y, {}, at::Reduction::Sum).item<double>();
      auto predicted = logits.argmax(-1);  // (b)
      score.correct += predicted.eq(y).sum().item<double>();
      if (full) {
        auto labels = y.cpu(), guesses = predicted.cpu();  // (b), (b)
        for (int64_t k = 0; k < b; ++k)
          score.outputs.push_back(data_->classes.at(static_cast<size_t>(labels[k].item<int64_t>())) + "\t" +
                                  data_->classes.at(static_cast<size_t>(guesses[k].item<int64_t>())));
      }
      score.count += static_cast<double>(b);
    }
    model_->train();
    return score;
  }

  void draw_attention(const AttentionRequest& r) override {
    if (!r.texts.empty()) fail("attention: the vit family draws images (--image), not --text");
    if (!data_) open_examples(config_.train.data);
    const auto& split = data_->split(r.split);
    const int64_t n = split.images.size(0);
    if (r.indices.empty()) fail("attention: name images with --image (indices into the {} split)", r.split);
    if (r.layer >= config_.model.n_layer || r.layer < -1)
      fail("attention: --layer must be in [0, {}) (got {})", config_.model.n_layer, r.layer);
    if (r.head >= config_.model.n_head || r.head < -1)
      fail("attention: --head must be in [0, {}) (got {})", config_.model.n_head, r.head);
    if (r.head >= 0 && r.layer < 0) fail("attention: --head needs --layer (the rollout mixes every head)");
    std::vector<int64_t> ids;
    for (int64_t i : r.indices) {
      if (i < 0 || i >= n) fail("attention: image {} is outside the {} split (0 .. {})", i, r.split, n - 1);
      ids.push_back(i);
    }
    torch::NoGradGuard no_grad;
    model_->eval();
    auto images = split.images.index_select(0, torch::tensor(ids, torch::kLong));  // (b, S, S)
    std::vector<torch::Tensor> weights;                                          // L x (b, K, N, N)
    auto probs = torch::softmax(model_->forward(images.to(device()), &weights), -1).cpu();  // (b, C)
    if (r.weights)
      for (const auto& w : weights) r.weights->push_back(w.to(torch::kDouble).cpu());
    if (r.out.empty()) return;
    torch::Tensor maps;  // (b, G, G)
    const int64_t G = config_.model.grid();
    if (r.layer < 0) {
      for (auto& w : weights) w = w.to(torch::kDouble).cpu();
      maps = models::attention_rollout(weights);
    } else {
      auto w = weights[static_cast<size_t>(r.layer)].to(torch::kDouble).cpu();  // (b, K, N, N)
      auto a = r.head >= 0 ? w.select(1, r.head) : w.mean(1);                    // (b, N, N)
      maps = a.select(1, 0).narrow(1, 1, G * G).reshape({-1, G, G});              // (b, G, G)
    }
    std::vector<viz::Overlay> items;
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto b = static_cast<int64_t>(i);
      const int64_t label = split.labels[ids[i]].item<int64_t>(), guess = probs[b].argmax().item<int64_t>();
      viz::Overlay o;
      auto image = images[b].to(torch::kDouble) / 255.0;
      for (int64_t y = 0; y < image.size(0); ++y)
        o.image.emplace_back(image[y].data_ptr<double>(), image[y].data_ptr<double>() + image.size(1));
      auto m = maps[b].contiguous();
      for (int64_t y = 0; y < G; ++y) o.map.emplace_back(m[y].data_ptr<double>(), m[y].data_ptr<double>() + G);
      o.caption = fmt::format("#{} {} -> {} ({:.0f}%)", ids[i], data_->classes[static_cast<size_t>(label)],
                              data_->classes[static_cast<size_t>(guess)], 100 * probs[b][guess].item<double>());
      fmt::print("{} image {}: {}, predicted {} ({:.1f}%)\n", r.split, ids[i], data_->classes[static_cast<size_t>(label)],
                 data_->classes[static_cast<size_t>(guess)], 100 * probs[b][guess].item<double>());
      items.push_back(std::move(o));
    }
    const std::string what = r.layer < 0 ? "attention rollout over every layer"
                             : r.head < 0 ? fmt::format("layer {}, mean of the heads", r.layer)
                                          : fmt::format("layer {}, head {}", r.layer, r.head);
    viz::write_overlays(r.out, items, "class token's attention to the patches: " + what);
  }

  void bench(const BenchRequest& r) override {
    if (r.mode == BenchMode::kGenerate) unsupported("bench --mode generate");
    auto& c = config_.model;
    validate();
    torch::manual_seed(config_.train.seed);
    build();
    model_->to(r.device);
    make_optimizers();
    const int64_t B = config_.train.batch_size;
    const StepContext ctx = bench_context(config_.train, r.device);
    const double per_step = time_steps(r, [&] {
      auto x = torch::randint(256, {B, c.image_size, c.image_size}, torch::kLong).to(torch::kUInt8).to(r.device);
      auto y = torch::randint(c.classes, {B}, torch::kLong).to(r.device);
      if (r.eval()) {
        torch::NoGradGuard no_grad;
        model_->eval();
        model_->forward(x).sum().item<double>();
      } else {
        train_step(x, y, ctx).item<double>();
      }
    });
    report_bench(r, name(), "bench",
                 fmt::format("{}, {} layers, H {}, K {}, {} tokens (patch {}), B {}, threads {}",
                             r.eval() ? "eval forward" : "train step", c.n_layer, c.d_model, c.n_head, c.tokens(), c.patch,
                             B, r.threads),
                 fmt::format("{:.1f} ms/step, {:.0f} images/s", per_step * 1e3, static_cast<double>(B) / per_step),
                 {{"mode", bench_mode_name(r.mode)}, {"ms_per_step", per_step * 1e3},
                  {"images_per_s", static_cast<double>(B) / per_step}});
  }

 private:
  torch::Device device() const { return model_->head->weight.device(); }

  // Each image moved by (dy, dx) uniform in [-s, s]^2, background (0) filling what enters.
  static torch::Tensor translate(const torch::Tensor& images, int64_t s) {
    const int64_t b = images.size(0), S = images.size(1);
    auto padded = torch::constant_pad_nd(images, {s, s, s, s}, 0);  // (b, S + 2s, S + 2s)
    auto offsets = torch::randint(2 * s + 1, {b, 2}, torch::kLong);  // (b, 2)
    auto out = torch::empty_like(images);
    const int64_t* o = offsets.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) out[i].copy_(padded[i].narrow(0, o[2 * i], S).narrow(1, o[2 * i + 1], S));
    return out;  // (b, S, S)
  }

  VitModel model_{nullptr};
  std::unique_ptr<data::ImageSet> data_;
};

}  // namespace

std::vector<BenchSetting> vit_bench_settings() {
  return {};
}

std::unique_ptr<Family> make_vit_family(const nlohmann::json& config, const std::string& origin,
                                        const std::vector<std::string>& overrides) {
  return configured_family<VitFamily>(vit_config_from_json(config, origin), overrides);
}

}  // namespace spanformer::train
