// The family core's shared pieces (train/family.h): the step context's gradient reduction, a score's
// reduction over processes, weights from a checkpoint, the vocab_size rule and the one "has no" line.
#include "spanformer/train/family.h"

#include <torch/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "spanformer/dist/group.h"
#include "spanformer/dist/reducer.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/names.h"

namespace spanformer::train {

void StepContext::before_last_backward() const {
  if (reducer) reducer->arm();  // this backward completes the gradients: buckets reduce as they fill
}

void StepContext::reduce_gradients(const std::vector<torch::Tensor>& params) const {
  if (reducer) {
    reducer->finish();
  } else if (group) {
    // Every rank's loss is a mean over its equal share of the streams: the mean of the ranks'
    // gradients is the gradient of the global batch. One bucket, one all-reduce.
    std::vector<torch::Tensor> grads;
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    group->all_reduce_mean(grads);
  }
}

void Family::load_weights(const Checkpoint& in) {
  if (in.family() != name())
    fail("checkpoint {} is a {} model, not {}", in.path(), in.family(), name());
  auto diff = model_difference(in.config());
  if (!diff.empty()) fail("checkpoint {} is for another model: {} (config vs checkpoint)", in.path(), diff);
  in.read_parameters(module().named_parameters());
}


void save_weights(Family& family, const data::Vocab& vocab, const std::string& path) {
  CheckpointWriter out(family.name(), family.config_json(), vocab);
  for (const auto& item : family.module().named_parameters()) {
    // Imported weights (every caller imports): beyond float16's range (65504), far beyond what training
    // leaves in a network, a forward pass may overflow; said once per tensor, and `eval` refuses a
    // non-finite result. NaN and infinities were refused where each format is read.
    const double largest = item.value().numel() ? item.value().detach().abs().max().item<double>() : 0.0;
    if (largest > 65504.0)
      fmt::print(stderr, "spanformer: warning: {}: tensor '{}' holds values up to {:.3g}, beyond float16's range: "
                 "its products may overflow\n", path, item.key(), largest);
    out.put("model." + item.key(), item.value());
  }
  out.save(path);
}

void ExampleScore::all_reduce(dist::Group* group) {
  if (!group) return;
  nll_sum = group->all_reduce_sum(nll_sum);
  correct = group->all_reduce_sum(correct);
  count = group->all_reduce_sum(count);
  if (bleu) {
    for (auto* counts : {&bleu->correct, &bleu->total})
      for (auto& v : *counts) v = static_cast<int64_t>(group->all_reduce_sum(static_cast<double>(v)));
    bleu->sys_len = static_cast<int64_t>(group->all_reduce_sum(static_cast<double>(bleu->sys_len)));
    bleu->ref_len = static_cast<int64_t>(group->all_reduce_sum(static_cast<double>(bleu->ref_len)));
  }
}

constexpr auto kBenchModeNames = name_table("--mode", std::pair{BenchMode::kTrain, "train"},
                                            std::pair{BenchMode::kEval, "eval"},
                                            std::pair{BenchMode::kGenerate, "generate"});

const char* bench_mode_name(BenchMode mode) { return kBenchModeNames.name(mode); }
BenchMode parse_bench_mode(const std::string& name) { return kBenchModeNames.parse(name); }

double BenchRequest::number(const std::string& name, double fallback) const {
  auto it = settings.find(name);
  if (it == settings.end()) return fallback;
  try {
    size_t used = 0;
    const double x = std::stod(it->second, &used);
    if (used == it->second.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  fail("bench: --{} must be a number (got '{}')", name, it->second);
}

int64_t BenchRequest::integer(const std::string& name, int64_t fallback) const {
  auto it = settings.find(name);
  if (it == settings.end()) return fallback;
  try {
    size_t used = 0;
    const long long x = std::stoll(it->second, &used);
    if (used == it->second.size()) return x;
  } catch (const std::exception&) {
  }
  fail("bench: --{} must be an integer (got '{}')", name, it->second);
}

std::string BenchRequest::text(const std::string& name) const {
  auto it = settings.find(name);
  return it == settings.end() ? "" : it->second;
}

void Family::fill_vocab_size(int64_t& vocab_size, int64_t V, const std::string& origin) {
  if (vocab_size == 0) vocab_size = V;
  if (vocab_size != V) fail("config vocab_size {} does not match the vocabulary of {} ({} tokens)", vocab_size, origin, V);
}

void Family::unsupported(const std::string& what) const { fail("the {} family has no {}", name(), what); }

torch::Device device_named(const std::string& name) {
  try {
    return torch::Device(name);
  } catch (const c10::Error&) {
    fail("unknown device '{}' (cpu, cuda or cuda:N)", name);
  }
}

torch::Device parse_device(const std::string& name) {
  const torch::Device device = device_named(name);
  if (device.is_cuda() && !torch::cuda::is_available())
    fail("device '{}' asked for, but no CUDA device is available to this LibTorch build", name);
  if (device.is_cuda() && device.has_index() && device.index() >= static_cast<int>(torch::cuda::device_count()))
    fail("device '{}' asked for, but this machine has {} CUDA device(s) (cuda:0 .. cuda:{})", name,
         torch::cuda::device_count(), torch::cuda::device_count() - 1);
  return device;
}

void write_logprobs(const std::string& path, const torch::Tensor& logprobs) {
  auto lp = logprobs.to(torch::kDouble).contiguous();
  const double* p = lp.data_ptr<double>();
  std::string text;
  text.reserve(static_cast<size_t>(lp.numel()) * 12);
  for (int64_t i = 0; i < lp.numel(); ++i) text += fmt::format("{:.9g}\n", p[i]);
  write_file_atomic(path, text);
}

}  // namespace spanformer::train
