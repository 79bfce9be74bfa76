// Shared helpers for the test suite: temporary directories and small real corpora.
#pragma once
#include <ftw.h>

#include <cstdio>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/modules/normalization.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "spanformer/data/corpus.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/runner.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::tu {

inline std::string shared_dir() { return SPANFORMER_SHARED_DIR; }

// max |a - b| in double, on the CPU (a and b of one shape, any dtype and device).
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().cpu().to(at::kDouble) - b.detach().cpu().to(at::kDouble)).abs().max().item<double>();
}

// LayerNorm by its formula, (x - mean) / sqrt(var + 1e-5) * weight + bias over the last dim (biased var),
// from the module's parameters.
inline torch::Tensor layer_norm(const torch::Tensor& x, const torch::nn::LayerNorm& n) {
  auto mu = x.mean(-1, true), var = (x - mu).pow(2).mean(-1, true);
  return (x - mu) / torch::sqrt(var + 1e-5) * n->weight + n->bias;
}

// Removes a directory tree (nftw, depth first). Not std::filesystem::remove_all: PyTorch's wheels
// (LibTorch 2.x) export their own copy of it from libtorch.so, which crashes through a null pointer
// when it wins symbol resolution (seen with PyTorch 2.11 on the GPU machine).
inline void remove_tree(const std::string& path) {
  nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

// A fresh directory under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("spanformer-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    remove_tree(path_.string());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { remove_tree(path_.string()); }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

// The message of the spanformer::Error that f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The statement throws spanformer's Error with `part` in its message (the message is what a user reads).
#define EXPECT_ERROR_WITH(statement, part)                                                             \
  do {                                                                                                 \
    const std::string spanformer_message_ = ::spanformer::tu::error_of([&] { (void)(statement); }); \
    EXPECT_NE(spanformer_message_.find(part), std::string::npos)                                       \
        << #statement << " threw \"" << spanformer_message_ << "\", expected a message with \"" << (part) << "\""; \
  } while (0)

// Checks autograd gradients of the scalar f() against central differences in double precision, at about
// seven elements of each input. Truncation O(eps^2) + rounding O(1e-16 / eps) ~ 1e-9 with eps = 1e-6,
// so 1e-6 relative (or absolute below 1) is a safe bound that still catches a wrong formula.
template <typename F>
void expect_finite_differences(const F& f, const std::vector<at::Tensor>& inputs) {
  auto grads = torch::autograd::grad({f()}, inputs);
  const double eps = 1e-6;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto flat = inputs[i].view({-1});
    for (int64_t j = 0; j < flat.numel(); j += std::max<int64_t>(1, flat.numel() / 7)) {
      double numeric;
      {
        at::NoGradGuard guard;
        const double orig = flat[j].item<double>();
        flat[j] = orig + eps;
        const double up = f().template item<double>();
        flat[j] = orig - eps;
        const double down = f().template item<double>();
        flat[j] = orig;
        numeric = (up - down) / (2 * eps);
      }
      EXPECT_NEAR(grads[i].reshape({-1})[j].template item<double>(), numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << "input " << i << " element " << j;
    }
  }
}

// Two checkpoints agree bit for bit: every entry of their manifests (weights, optimizer states, data
// positions, caches, generator states) except the wall-clock time, and the same entries.
inline void expect_same_checkpoint(const std::string& a_path, const std::string& b_path) {
  spanformer::train::Checkpoint a(a_path), b(b_path);
  const auto ja = nlohmann::json::parse(a.text("manifest")), jb = nlohmann::json::parse(b.text("manifest"));
  for (const auto& [key, digest] : ja.items())
    if (key != "state.elapsed_seconds") EXPECT_EQ(digest, jb[key]) << key;
  EXPECT_EQ(ja.size(), jb.size());
}

inline std::string read_file_or_empty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A run of any family's config (JSON) on the engine's runner, without progress output.
inline spanformer::train::RunResult run_family(const nlohmann::json& config, const std::string& out, bool resume = false,
                                               int64_t stop_after = -1) {
  auto family = spanformer::train::family_from_json(config, "test config");
  spanformer::train::RunOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.progress = false;
  o.stop_after = stop_after;
  return spanformer::train::run_training(*family, o);
}

// Mixed precision on the engine (train.amp = bf16, set here on `config`): the run's losses differ from
// the float32 run's (autocast acted) but stay within `tolerance` relative of them, its checkpoint keeps
// float32 weights (the master copy), and stopped at `stop_after` and resumed it ends bit for bit where
// the uninterrupted bf16 run ends (stop_after < 0: not checked, for devices whose kernels sum in a
// varying order).
inline void expect_bf16_run(nlohmann::json config, const std::string& dir, int64_t stop_after, double tolerance) {
  const auto fp32 = run_family(config, dir + "/fp32");
  config["train"]["amp"] = "bf16";
  const auto bf16 = run_family(config, dir + "/bf16");
  for (auto [a, b, what] : {std::tuple{fp32.last_train, bf16.last_train, "train"}, std::tuple{fp32.last_valid, bf16.last_valid, "valid"}}) {
    std::printf("measured: %s %s float32 %.6f, bf16 %.6f (%+.2f%%)\n", what, metrics::unit_name(fp32.unit), a, b, 100 * (b - a) / a);
    EXPECT_NE(a, b) << what << ": the bf16 run computed exactly the float32 run's figure";
    EXPECT_NEAR(b, a, tolerance * std::abs(a)) << what << " (" << metrics::unit_name(fp32.unit) << ")";
  }
  spanformer::train::Checkpoint checkpoint(dir + "/bf16/checkpoint.pt");
  const auto manifest = nlohmann::json::parse(checkpoint.text("manifest"));
  int weights = 0;
  for (const auto& item : manifest.items())
    if (item.key().rfind("model.", 0) == 0) {
      EXPECT_EQ(checkpoint.tensor(item.key()).scalar_type(), at::kFloat) << item.key();
      ++weights;
    }
  EXPECT_GT(weights, 0);
  if (stop_after < 0) return;
  run_family(config, dir + "/split", false, stop_after);
  run_family(config, dir + "/split", true);
  expect_same_checkpoint(dir + "/bf16/checkpoint.pt", dir + "/split/checkpoint.pt");
}

inline void prepare_dickens_slice(const std::string& dir, int64_t bytes) {
  std::ifstream in(shared_dir() + "/data/dickens.txt", std::ios::binary);
  ASSERT_TRUE(in) << "missing ../shared/data/dickens.txt";
  std::string text(static_cast<size_t>(bytes), '\0');
  in.read(text.data(), bytes);
  write_text(dir + "/slice.txt", text);
  data::PrepareOptions options;
  options.crlf_to_lf = true;
  data::prepare_bytes(dir + "/slice.txt", dir, options);
}

}  // namespace spanformer::tu
