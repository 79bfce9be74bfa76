// The ViT family: the IDX reader against files written byte by byte and the real
// Fashion-MNIST files; the model against a plain double-precision composition written from the
// paper's equations (patches by unfold, per-head attention by its formula, LayerNorm and GELU by
// theirs): the two sum the same terms in other orders, so 1e-10 on logits of O(1) is safe; attention
// rollout against its closed form; a short run on a slice of the real data learns and a stopped and
// resumed run ends bit for bit where an uninterrupted one does (random translations included).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "spanformer/config/vit_config.h"
#include "spanformer/data/idx.h"
#include "spanformer/models/vit.h"
#include "util.h"

using namespace spanformer;

namespace {

const char* kFashion = "/usr/share/datasets/fashion-mnist";

using tu::layer_norm;

// logits (B, C) of the header's equations, from the model's weights only.
torch::Tensor reference_vit(models::VitModelImpl& m, const torch::Tensor& images) {
  const auto& c = m.config();
  const int64_t B = images.size(0), P = c.patch, G = c.grid(), H = c.d_model, K = c.n_head, D = H / K, N = c.tokens();
  auto x = (images.to(torch::kDouble).unsqueeze(1) / 255.0 - c.pixel_mean) / c.pixel_std;        // (B, 1, S, S)
  auto patches = x.reshape({B, G, P, G, P}).permute({0, 1, 3, 2, 4}).reshape({B, G * G, P * P});  // (B, G^2, P^2)
  auto w = m.patch_embed->weight.reshape({H, P * P});                                           // (H, P^2)
  auto z = torch::cat({m.cls_token.expand({B, 1, H}), torch::matmul(patches, w.t()) + m.patch_embed->bias}, 1) +
           m.pos_embed;  // (B, N, H)
  for (const auto& module : *m.blocks) {
    auto& blk = *module->as<models::VitBlock>();
    auto h = layer_norm(z, blk.norm1);
    auto q = blk.attn->w_q(h), k = blk.attn->w_k(h), v = blk.attn->w_v(h);  // (B, N, H)
    auto o = torch::zeros({B, N, H}, torch::kDouble);
    for (int64_t hd = 0; hd < K; ++hd) {
      auto qh = q.narrow(2, hd * D, D), kh = k.narrow(2, hd * D, D), vh = v.narrow(2, hd * D, D);
      auto e = torch::exp(torch::bmm(qh, kh.transpose(1, 2)) / std::sqrt(static_cast<double>(D)));  // (B, N, N)
      o.narrow(2, hd * D, D).copy_(torch::bmm(e / e.sum(-1, true), vh));
    }
    z = z + blk.attn->w_o(o);
    auto u = blk.fc1(layer_norm(z, blk.norm2));
    z = z + blk.fc2(0.5 * u * (1 + torch::erf(u / std::sqrt(2.0))));
  }
  return m.head(layer_norm(z.select(1, 0), m.norm));
}

VitConfig tiny_vit(const std::string& data) {
  VitConfig c;
  c.model.patch = 7;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 32;
  c.model.d_inner = 64;
  c.model.valid_images = 200;
  c.train.data = data;
  c.train.batch_size = 32;
  c.train.nb_steps = 100;
  c.train.lr_warmup = 5;
  c.train.eval_interval = 50;
  c.train.eval_batch_size = 100;
  c.train.threads = 0;  // OMP_NUM_THREADS (one under scripts/test.sh), else every core
  return c;
}

// The first `n` training and `m` test images of Fashion-MNIST, as uncompressed IDX files in `dir`.
void write_fashion_slice(const std::string& dir, int64_t n, int64_t m) {
  auto set = data::load_image_set(kFashion, 5000);
  auto put = [&](const std::string& prefix, const data::ImageSplit& s, int64_t count) {
    auto images = s.images.narrow(0, 0, count).contiguous();
    auto labels = s.labels.narrow(0, 0, count).to(torch::kUInt8).contiguous();
    data::write_idx(dir + "/" + prefix + "-images-idx3-ubyte", {count, 28, 28},
                    std::vector<uint8_t>(images.data_ptr<uint8_t>(), images.data_ptr<uint8_t>() + images.numel()));
    data::write_idx(dir + "/" + prefix + "-labels-idx1-ubyte", {count},
                    std::vector<uint8_t>(labels.data_ptr<uint8_t>(), labels.data_ptr<uint8_t>() + count));
  };
  put("train", set.train, n);
  put("t10k", set.test, m);
}

}  // namespace

TEST(Idx, ReadsWhatItWritesAndRefusesMalformedFiles) {
  tu::TempDir tmp;
  std::vector<uint8_t> values(2 * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7);
  data::write_idx(tmp.file("a"), {2, 3, 4}, values);
  auto a = data::read_idx(tmp.file("a"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.values, values);
  auto bytes = tu::read_file_or_empty(tmp.file("a"));
  auto expect_error = [&](const std::string& content, const std::string& words) {
    tu::write_text(tmp.file("bad"), content);
    try {
      data::read_idx(tmp.file("bad"));
      ADD_FAILURE() << "no error for " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(tmp.file("bad")), std::string::npos) << e.what();
    }
  };
  expect_error("", "too short");
  expect_error(bytes.substr(0, bytes.size() - 1), "truncated or corrupt");
  expect_error(bytes + "x", "truncated or corrupt");
  expect_error("\x01" + bytes.substr(1), "not an IDX file");
  expect_error(bytes.substr(0, 2) + "\x0d" + bytes.substr(3), "not supported");
  expect_error(std::string("\x1f\x8b\x08\x00garbage", 11), "");  // gzip magic, corrupt stream
  EXPECT_ERROR_WITH(data::read_idx(tmp.file("missing")), "missing: no such file");
  EXPECT_ERROR_WITH(data::load_image_set(tmp.path()), "no train-images-idx3-ubyte or train-images-idx3-ubyte.gz");  // no image files
}

TEST(Idx, ReadsDebiansFashionMnist) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto set = data::load_image_set(kFashion, 5000);
  EXPECT_EQ(set.train.images.sizes(), (torch::IntArrayRef{55000, 28, 28}));
  EXPECT_EQ(set.valid.images.size(0), 5000);
  EXPECT_EQ(set.test.images.sizes(), (torch::IntArrayRef{10000, 28, 28}));
  // Every class is 1/10 of the test set, and the train mean is the normalisation's mean.
  EXPECT_TRUE(torch::bincount(set.test.labels).eq(1000).all().item<bool>());
  EXPECT_NEAR((torch::cat({set.train.images, set.valid.images}).to(torch::kDouble) / 255).mean().item<double>(), 0.2860,
              5e-5);
}

TEST(VitModel, MatchesThePapersEquationsInDouble) {
  torch::manual_seed(5);
  VitModelConfig c;
  c.patch = 7;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.d_inner = 24;
  models::VitModel m(c);
  m->to(torch::kDouble);
  {  // non-zero class token and biases, so that every term is seen
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  auto images = torch::randint(256, {3, 28, 28}, torch::kLong).to(torch::kUInt8);
  std::vector<torch::Tensor> weights;
  auto logits = m->forward(images, &weights);
  EXPECT_LT((logits - reference_vit(*m, images)).abs().max().item<double>(), 1e-10);
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_EQ(weights[0].sizes(), (torch::IntArrayRef{3, 2, 17, 17}));
  EXPECT_ERROR_WITH(m->forward(torch::zeros({3, 27, 27}, torch::kUInt8)), "images must be (B, 1, 28, 28) (got 3x27x27)");
}

TEST(VitModel, AttentionRolloutMatchesItsClosedForm) {
  // Uniform attention in every layer: each factor is (J / N + I) / 2 with J all ones; J^2 = N J, so the
  // product of L factors is I / 2^L + (1 - 1 / 2^L) J / N, whose class row gives every patch (1 - 2^-L) / N.
  const int64_t N = 17, L = 3;
  std::vector<torch::Tensor> uniform(L, torch::full({2, 4, N, N}, 1.0 / N, torch::kDouble));
  auto r = models::attention_rollout(uniform);
  EXPECT_EQ(r.sizes(), (torch::IntArrayRef{2, 4, 4}));
  EXPECT_LT((r - (1 - std::pow(0.5, L)) / N).abs().max().item<double>(), 1e-15);
  // One layer: row 0 of (A + I) / 2 over the patches, averaged over heads.
  auto a = torch::softmax(torch::randn({1, 2, N, N}, torch::kDouble), -1);
  auto one = models::attention_rollout({a});
  EXPECT_LT((one.flatten() - a.mean(1)[0][0].narrow(0, 1, N - 1) / 2).abs().max().item<double>(), 1e-15);
}

// train.amp = bf16 (tests/util.h): patch convolution, encoder, classifier.
TEST(VitTraining, MixedPrecisionBf16TrainsAndResumesBitForBit) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  tu::TempDir tmp;
  write_fashion_slice(tmp.path(), 600, 100);
  VitConfig c = tiny_vit(tmp.path());
  c.train.nb_steps = 20;
  c.train.eval_interval = 10;
  tu::expect_bf16_run(to_json(c), tmp.path(), 13, 0.03);
}

TEST(VitTraining, LearnsFashionMnistAndResumesBitForBit) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  tu::TempDir tmp;
  write_fashion_slice(tmp.path(), 1200, 200);
  VitConfig c = tiny_vit(tmp.path());
  c.model.augment_shift = 1;
  c.train.lr = 5e-3;
  auto full = tu::run_family(to_json(c), tmp.file("a"));
  EXPECT_GT(full.last_accuracy, 0.25) << "10 classes: chance is 0.1; this run reaches about 0.35";
  tu::run_family(to_json(c), tmp.file("b"), false, 53);  // stops inside the second epoch (31 batches each)
  tu::run_family(to_json(c), tmp.file("b"), true);
  tu::expect_same_checkpoint(tmp.file("a/checkpoint.pt"), tmp.file("b/checkpoint.pt"));
  // Another image set under the same run is refused on resume.
  write_fashion_slice(tmp.path(), 1100, 200);
  c.train.nb_steps = 120;
  EXPECT_ERROR_WITH(tu::run_family(to_json(c), tmp.file("b"), true), "was trained on other data than");
}
