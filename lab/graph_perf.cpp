// The lab's CUDA graphs timed (step_graph.h): a GPT config's training step and generation's per-token
// step, each eager and as a CUDA graph, in interleaved rounds, medians. Its figures decide whether the
// graphs leave the lab (docs/platform.md, "Awaiting a GPU").
//
//   spanformer_tests --graph-perf [--config FILE] [--amp bf16|off] [--rounds N] [--steps N]
//
// The training step is the GPT family's: the model's logits widened to float32, cross-entropy plus the
// span loss, the optimizer of train.optim (Adam or AdamW: the update a graph captures reads its rate on
// the device). Generation runs the fixed-shape per-token step (models/gpt.h) after a prompt of half the
// context, to a full one. Prints ms a step and tokens/s, and the graph's ratio to eager.
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spanformer/config/gpt_config.h"
#include "spanformer/models/gpt.h"
#include "spanformer/train/optim.h"
#include "spanformer/util/error.h"
#include "spanformer/util/precision.h"
#include "spanformer/util/torch_compat.h"
#include "step_graph.h"
#include "train/families/families.h"

namespace spanformer::lab {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Why this config's training step cannot be captured (empty: it can): the attentions whose step reads
// nothing on the host, the update that reads its rate on the device.
std::string training_refusal(const GptConfig& c) {
  const auto& m = c.model;
  if (m.attention != attention::CausalKind::kDense && m.attention != attention::CausalKind::kFlash)
    return fmt::format("its {} attention is not captured (dense and flash are)", attention::causal_kind_name(m.attention));
  if (m.attention == attention::CausalKind::kFlash && m.attn_dropout > 0)
    return "flash attention draws its dropout seed on the host (set model.attn_dropout to 0)";
  if (m.reversible) return "the reversible layers recompute the forward in the backward, outside autograd's graph";
  if (c.train.optim != OptimKind::kAdam && c.train.optim != OptimKind::kAdamW)
    return fmt::format("train.optim is {}; the captured update is Adam's or AdamW's", optim_name(c.train.optim));
  return "";
}

struct Trainer {
  models::GptModel model{nullptr};
  std::optional<train::Optimizer> optimizer;
  std::optional<StepGraph> graph;

  Trainer(const GptConfig& c, const torch::Device& device, bool graphed) {
    torch::manual_seed(c.train.seed);
    model = models::GptModel(c.model);
    model->to(device);
    model->train();
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    optimizer.emplace(named, train::optimizer_options(c.train));  // train/families/families.h
    if (graphed) graph.emplace(device);
  }

  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, Amp amp) {  // x, y (B, T)
    optimizer->zero_grad();
    std::optional<compat::AutocastGuard> autocast;
    if (amp == Amp::kBf16) autocast.emplace(c10::DeviceType::CUDA, at::kBFloat16);
    auto logits = widen_reduced(model->logits(model->forward(x)));  // (B, T, V)
    auto nll = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    autocast.reset();
    (nll + model->span_loss()).backward();
    return nll.detach();
  }

  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& y, double lr, Amp amp) {
    if (!graph) {
      auto l = loss(x, y, amp);
      optimizer->step(lr);
      return l;
    }
    optimizer->begin_graph_step(lr);
    return graph->run(x, y, [&](const torch::Tensor& gx, const torch::Tensor& gy) {
      auto l = loss(gx, gy, amp);
      optimizer->graph_step();
      return l;
    });
  }
};

}  // namespace

int graph_perf_main(const std::vector<std::string>& args) {
  std::string config_path = "configs/gpt/bench_attention.json", amp_text = "bf16";
  int64_t rounds = 5, steps = 10;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (i + 1 >= args.size()) fail("--graph-perf: {} needs a value (--config FILE, --amp bf16|off, --rounds N, --steps N)", a);
    const auto& v = args[++i];
    if (a == "--config") config_path = v;
    else if (a == "--amp") amp_text = v;
    else if (a == "--rounds") rounds = std::stoll(v);
    else if (a == "--steps") steps = std::stoll(v);
    else fail("--graph-perf: unknown option '{}' (--config FILE, --amp bf16|off, --rounds N, --steps N)", a);
  }
  if (rounds < 1 || steps < 1) fail("--graph-perf: --rounds and --steps must be >= 1");
  const Amp amp = parse_amp(amp_text);
  std::ifstream in(config_path);
  if (!in) fail("--graph-perf: cannot read {}", config_path);
  auto config = gpt_config_from_json(nlohmann::json::parse(in), config_path);
  if (config.model.vocab_size == 0) config.model.vocab_size = 256;
  validate(config.model);
  if (const auto why = training_refusal(config); !why.empty()) fail("--graph-perf: cannot capture this gpt step: {}", why);
  if (!torch::cuda::is_available()) fail("--graph-perf needs a CUDA device (none is visible)");
  const torch::Device device(torch::kCUDA);
  const auto& c = config.model;
  const int64_t B = config.train.batch_size, T = c.context, V = c.vocab_size;

  // Training: one eager and one graphed trainer, their rounds interleaved (each round `steps` steps of each).
  Trainer eager(config, device, false), graphed(config, device, true);
  std::vector<double> eager_ms, graph_ms;
  for (int64_t r = 0; r <= rounds; ++r) {  // round 0 warms both up (the graph is captured there)
    for (auto* t : {&eager, &graphed}) {
      torch::cuda::synchronize();
      const double t0 = seconds();
      torch::Tensor last;
      for (int64_t s = 0; s < steps; ++s) {
        auto x = torch::randint(V, {B, T}, torch::kLong).to(device), y = torch::randint(V, {B, T}, torch::kLong).to(device);
        last = t->step(x, y, 1e-4, amp);
      }
      last.item<double>();
      const double ms = (seconds() - t0) * 1e3 / static_cast<double>(steps);
      if (r > 0) (t == &eager ? eager_ms : graph_ms).push_back(ms);
    }
  }
  fmt::print("graph perf: {} ({} layers, H {}, T {}, B {}, attention {}, amp {})\n", config_path, c.n_layer, c.d_model, T, B,
             attention::causal_kind_name(c.attention), amp_name(amp));
  fmt::print("  train step: eager {:.2f} ms, CUDA graph {:.2f} ms ({:.2f}x), medians of {} rounds of {} steps\n",
             median(eager_ms), median(graph_ms), median(eager_ms) / median(graph_ms), rounds, steps);

  // Generation: the fixed-shape step eager and replayed, after a prompt of half the context, to a full one.
  if (const auto why = graphed.model->fixed_shape_refusal(); !why.empty()) {
    fmt::print("  generation: not captured: {}\n", why);
    return 0;
  }
  auto& model = graphed.model;
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t prompt = std::max<int64_t>(1, T / 2), tokens = T - prompt;
  StepGraph graph(device, StepGraph::kWarmup, "generation as a CUDA graph");
  std::vector<double> eager_rate, graph_rate;
  for (int64_t r = 0; r <= rounds; ++r) {
    for (bool replayed : {false, true}) {
      models::GptDecoder d;
      d.fixed_shapes = true;
      if (replayed)
        d.runner = [&graph](const torch::Tensor& x, const torch::Tensor& at, const models::GptStepFn& step) {
          return graph.run(x, at, step);
        };
      model->extend(torch::randint(V, {1, prompt}, torch::kLong).to(device), d);
      torch::cuda::synchronize();
      const double t0 = seconds();
      torch::Tensor last;
      for (int64_t i = 0; i < tokens; ++i) last = model->extend(torch::randint(V, {1, 1}, torch::kLong).to(device), d);
      last.sum().item<double>();
      if (r > 0) (replayed ? graph_rate : eager_rate).push_back(static_cast<double>(tokens) / (seconds() - t0));
    }
  }
  fmt::print("  generation, tokens {} .. {} after {}: eager {:.0f} tokens/s, CUDA graph {:.0f} tokens/s ({:.2f}x)\n",
             prompt + 1, T, prompt, median(eager_rate), median(graph_rate), median(graph_rate) / median(eager_rate));
  return 0;
}

}  // namespace spanformer::lab
