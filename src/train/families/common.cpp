// Helpers the families share (declared in families.h): prompts as ids, the gradient-accumulating train
// step, recurrent state in checkpoints, sampling, the main optimizer, span log fields and bench timing.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "families.h"
#include "spanformer/models/sampling.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/data/byte_bpe.h"
#include "spanformer/util/precision.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/torch_compat.h"

namespace spanformer::train {

std::vector<int64_t> prompt_ids(const data::Vocab& vocab, const std::string& prompt) {
  std::vector<int64_t> ids;
  if (vocab.bpe) {  // GPT-2's tokenizer, as transformers encodes; an empty prompt starts from <|endoftext|>
    ids = vocab.bpe->encode(prompt);
    if (ids.empty()) ids.push_back(std::max<int64_t>(0, vocab.bpe->end_of_text()));
    return ids;
  }
  if (vocab.word_level) {
    int64_t unk = -1, eos = -1;
    std::unordered_map<std::string, int64_t> index;
    for (int64_t i = 0; i < vocab.size(); ++i) {
      index[vocab.tokens[i]] = i;
      if (vocab.tokens[i] == "<unk>") unk = i;
      if (vocab.tokens[i] == "<eos>") eos = i;
    }
    std::istringstream in(prompt);
    std::string word;
    std::vector<std::string> unknown;
    while (in >> word) {
      auto it = index.find(word);
      if (it != index.end()) {
        ids.push_back(it->second);
      } else {
        unknown.push_back(word);
        if (unk >= 0) ids.push_back(unk);
      }
    }
    if (!unknown.empty())
      fmt::print(stderr, "spanformer: warning: {} prompt word(s) not in the vocabulary, {}: {}\n", unknown.size(),
                 unk >= 0 ? "read as <unk>" : "left out", fmt::join(unknown.begin(), unknown.begin() + std::min<size_t>(unknown.size(), 10), " "));
    if (ids.empty()) ids.push_back(eos >= 0 ? eos : 0);
    return ids;
  }
  const auto byte_to_id = vocab.byte_to_id();
  std::string unknown;
  for (unsigned char c : prompt) {
    if (byte_to_id[c] >= 0) ids.push_back(byte_to_id[c]);
    else if (unknown.find(static_cast<char>(c)) == std::string::npos) unknown += static_cast<char>(c);
  }
  if (!unknown.empty()) {
    std::string shown;
    for (unsigned char c : unknown) shown += c >= 32 && c < 127 ? fmt::format("'{}' ", static_cast<char>(c)) : fmt::format("0x{:02x} ", c);
    shown.pop_back();
    fmt::print(stderr, "spanformer: warning: prompt characters not in the vocabulary were left out: {}\n", shown);
  }
  if (ids.empty()) ids.push_back(byte_to_id['\n'] >= 0 ? byte_to_id['\n'] : 0);  // start from <eos>
  return ids;
}

// bf16 on a CPU that has no bf16 products in hardware (neither AMX nor AVX512-BF16): it runs, each
// product widened to float32 by the library, and is slower than float32 itself. Said once a process.
static void say_once_if_bf16_is_slow() {
  static std::once_flag once;
  std::call_once(once, [] {
    const auto line = bf16_speed_warning(compat::cpu_info(), bf16_products_in_hardware());
    if (!line.empty()) fmt::print(stderr, "{}\n", line);
  });
}

torch::Tensor accumulate_gradients(int64_t streams, int64_t split, std::vector<torch::Tensor>& state,
                                   const StepContext& ctx, const std::vector<torch::Tensor>& params,
                                   const GroupLoss& group_loss) {
  const int64_t part = streams / split;
  torch::Tensor loss_sum;
  std::vector<std::vector<torch::Tensor>> next(state.size());
  for (int64_t s = 0; s < split; ++s) {
    std::vector<torch::Tensor> part_state;
    for (auto& t : state) part_state.push_back(t.narrow(0, s * part, part));  // (B/split, T, H)
    torch::Tensor nll, loss;
    {  // train.amp: the forward under autocast, the backward (and everything after) outside it
      std::optional<compat::AutocastGuard> autocast;
      if (ctx.amp == Amp::kBf16) {
        autocast.emplace(ctx.device_type, at::kBFloat16);
        if (ctx.device_type == c10::DeviceType::CPU) say_once_if_bf16_is_slow();
      }
      std::tie(nll, loss) = group_loss(s * part, part, part_state);
    }
    for (size_t l = 0; l < state.size(); ++l)  // carried state keeps its dtype (autocast may narrow it)
      if (part_state[l].scalar_type() != state[l].scalar_type()) part_state[l] = part_state[l].to(state[l].scalar_type());
    if (s == split - 1) ctx.before_last_backward();
    (widen_reduced(loss) / static_cast<double>(split)).backward();
    auto mean = nll.detach().to(torch::kFloat) / static_cast<double>(split);
    loss_sum = loss_sum.defined() ? loss_sum + mean : mean;
    for (size_t l = 0; l < state.size(); ++l) next[l].push_back(part_state[l]);
  }
  for (size_t l = 0; l < state.size(); ++l) state[l] = split == 1 ? next[l][0] : torch::cat(next[l], 0);
  ctx.reduce_gradients(params);
  return loss_sum;
}

void save_stream_state(CheckpointWriter& out, const std::string& name, const std::vector<torch::Tensor>& state,
                       const std::function<torch::Tensor(const torch::Tensor&)>& gather) {
  for (size_t i = 0; i < state.size(); ++i) out.put(fmt::format("state.{}.{}", name, i), gather(state[i]));
}

std::vector<torch::Tensor> load_stream_state(const Checkpoint& in, const std::string& name, int64_t n, int64_t width,
                                             int64_t max_length, int64_t batch, int64_t first, int64_t count,
                                             torch::Device device) {
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    auto t = in.tensor(fmt::format("state.{}.{}", name, i));
    if (t.dim() != 3 || t.size(2) != width || t.size(1) > max_length)
      fail("checkpoint {}: state '{}.{}' has shape {}", in.path(), name, i, fmt::join(t.sizes(), "x"));
    if (t.size(0) != batch) fail("checkpoint {} was trained with batch_size {}, the config says {}", in.path(), t.size(0), batch);
    if (!torch::isfinite(t).all().item<bool>()) fail("checkpoint {}: state '{}.{}' holds non-finite values", in.path(), name, i);
    out.push_back(t.narrow(0, first, count).contiguous().to(device));
  }
  return out;
}

void sample_tokens(const data::Vocab& vocab, const SampleRequest& r, int64_t block,
                   const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                   const std::function<torch::Tensor(const torch::Tensor&)>& scores, torch::Device device) {
  models::SamplingOptions options{r.temperature, r.top_k, r.top_p};
  models::check(options);
  if (r.tokens < 0) fail("the number of tokens must be >= 0 (got {})", r.tokens);
  torch::NoGradGuard no_grad;
  auto ids = prompt_ids(vocab, r.prompt);
  torch::Tensor last;
  for (size_t start = 0; start < ids.size(); start += block) {
    const int64_t n = std::min<int64_t>(block, static_cast<int64_t>(ids.size() - start));
    last = forward(torch::from_blob(ids.data() + start, {1, n}, torch::kLong).to(device)).narrow(1, n - 1, 1);  // (1, 1, H)
  }
  for (int64_t t = 0; t < r.tokens; ++t) {
    const int64_t id = models::sample_token(scores(last).view({-1}), options);  // (V)
    if (r.on_text) r.on_text(vocab.decode(id));
    if (t + 1 < r.tokens) last = forward(torch::full({1, 1}, id, torch::kLong).to(device));
  }
}

OptimizerOptions optimizer_options(const TrainConfig& train) {
  OptimizerOptions o;
  o.kind = train.optim;
  o.momentum = train.momentum;
  o.grad_clip = train.grad_clip;
  o.weight_decay = train.weight_decay;
  o.beta2 = train.adam_beta2;
  return o;
}

std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const TrainConfig& train) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : model.named_parameters()) params.emplace_back(item.key(), item.value());
  return std::make_unique<Optimizer>(params, optimizer_options(train));
}

void log_spans(const std::vector<std::vector<double>>& spans, nlohmann::json& record, std::string& text) {
  if (spans.empty()) return;
  std::vector<double> mean, max;
  for (const auto& z : spans) {
    double s = 0, m = 0;
    for (double v : z) s += v, m = std::max(m, v);
    mean.push_back(s / static_cast<double>(z.size()));
    max.push_back(m);
  }
  record["span_mean"] = mean;
  record["span_max"] = max;
  record["spans"] = spans;  // per layer, per head (tokens): the span-versus-training figure's data
  text += fmt::format(" | spans {:.0f}", fmt::join(mean, " "));
}

void set_bimodal_spans(const std::vector<torch::Tensor>& span_ratios, double L) {
  std::mt19937 rng(1);
  torch::NoGradGuard no_grad;
  for (auto r : span_ratios) {
    for (int64_t h = 0; h < r.size(0); ++h) {
      const double z = h % 4 == 3 ? std::uniform_real_distribution<double>(std::min(2048.0, L), L)(rng)
                                  : std::uniform_real_distribution<double>(16.0, std::min(256.0, L))(rng);
      r[h] = z / L;
    }
  }
}

std::vector<BenchSetting> span_bench_settings() {
  return {{"span", "every head's span z, in tokens (models with adaptive spans)"},
          {"span-dist", "bimodal: per layer, 3 of 4 heads in [16, 256] and 1 of 4 in [2048, L] (fixed seed)"}};
}

double bench_span(const BenchRequest& r) {
  const double span = r.number("span", -1);
  if (r.has("span") && span < 0) fail("bench: --span must be >= 0 tokens (got {})", span);
  return span;
}

std::string bench_span_dist(const BenchRequest& r) {
  const std::string dist = r.text("span-dist");
  if (r.has("span-dist") && dist != "bimodal") fail("bench: --span-dist must be bimodal (got '{}')", dist);
  return dist;
}

int64_t parameter_count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

namespace {

// The profiler's trace (complete events, "ph": "X", microseconds) as a table on stderr: each operator's
// own time (its span less the spans of the calls nested in it on the same thread), per step, summed over
// the threads that ran operators (a parallel kernel's workers record theirs), largest first, the first
// `rows` and the rest in one line. Own time is what an operator's kernel costs: an
// aten::linear that only calls aten::addmm owns almost nothing.
void print_profile_table(const nlohmann::json& events, int64_t steps, double step_ms, size_t rows = 20) {
  struct Span {
    double begin, end;
    std::string name;
  };
  std::map<std::string, std::vector<Span>> by_thread;
  for (const auto& e : events)
    if (e.value("ph", "") == "X") {
      const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
      by_thread[e.at("tid").dump()].push_back({ts, ts + dur, e.at("name").get<std::string>()});
    }
  std::map<std::string, std::pair<double, int64_t>> own;  // name -> (microseconds, calls)
  for (auto& [tid, spans] : by_thread) {
    // Outer before inner: by start, the longer first on a tie.
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<std::pair<const Span*, double>> open;  // span, time of its children so far
    auto close_until = [&](double t) {
      while (!open.empty() && open.back().first->end <= t) {
        const auto [span, children] = open.back();
        open.pop_back();
        const double length = span->end - span->begin;
        auto& entry = own[span->name];
        entry.first += std::max(0.0, length - children), entry.second += 1;
        if (!open.empty()) open.back().second += length;
      }
    };
    for (const auto& span : spans) {
      close_until(span.begin);
      open.emplace_back(&span, 0.0);
    }
    close_until(std::numeric_limits<double>::infinity());
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> table(own.begin(), own.end());
  std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (const auto& row : table) total += row.second.first;
  const double per = 1e-3 / static_cast<double>(steps);  // microseconds in all -> ms per step
  fmt::print(stderr, "profile: operators by own time, ms per step (step {:.1f} ms; every thread {:.1f} ms)\n", step_ms,
             total * per);
  fmt::print(stderr, "  {:>9} {:>6} {:>7}  {}\n", "ms/step", "share", "calls", "operator");
  double rest = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    const auto& [name, figures] = table[i];
    if (i < rows) {
      fmt::print(stderr, "  {:9.2f} {:5.1f}% {:7}  {}\n", figures.first * per, 100.0 * figures.first / total,
                 figures.second / steps, name);
    } else {
      rest += figures.first, rest_calls += figures.second;
    }
  }
  if (table.size() > rows)
    fmt::print(stderr, "  {:9.2f} {:5.1f}% {:7}  ({} other operators)\n", rest * per, 100.0 * rest / total,
               rest_calls / steps, table.size() - rows);
}

}  // namespace

TokenSteps time_token_steps(const BenchRequest& r, int64_t V, int64_t B, int64_t T, const torch::Device& device,
                            const std::function<void(const torch::Tensor&, const torch::Tensor&)>& eval,
                            const std::function<double(const torch::Tensor&, const torch::Tensor&)>& train) {
  TokenSteps out;
  out.per_step = time_steps(r, [&] {
    auto x = torch::randint(V, {B, T}, torch::kLong).to(device);  // (B, T)
    auto y = torch::randint(V, {B, T}, torch::kLong).to(device);  // (B, T)
    if (r.eval()) {
      torch::NoGradGuard no_grad;
      eval(x, y);
    } else {
      const double loss = train(x, y);
      if (out.first_loss.is_null()) out.first_loss = loss;
    }
  });
  return out;
}

double time_steps(const BenchRequest& r, const std::function<void()>& step) {
  // At most 10^9 each: a count beyond it is a typo, and a step count that the timer divides by must stay
  // exact in a double.
  if (r.steps < 1 || r.warmup < 0 || r.steps > 1000000000 || r.warmup > 1000000000)
    fail("--steps must be >= 1 and --warmup >= 0, each at most 1000000000 (got {} and {})", r.steps, r.warmup);
  double total = 0;
  std::ostringstream trace;
  std::optional<torch::autograd::profiler::RecordProfile> profiler;
  for (int64_t i = 0; i < r.warmup + r.steps; ++i) {
    if (i == r.warmup && !r.profile.empty()) profiler.emplace(trace);
    const double t0 = now_seconds();
    step();
    const double dt = now_seconds() - t0;
    if (i >= r.warmup) total += dt;
    fmt::print(stderr, "  step {}/{}: {:.0f} ms{}\n", i + 1, r.warmup + r.steps, dt * 1e3, i < r.warmup ? " (warmup)" : "");
  }
  const double per_step = total / static_cast<double>(r.steps);
  if (profiler) {
    profiler.reset();  // writes the trace
    nlohmann::json events;
    try {
      events = nlohmann::json::parse(trace.str());
    } catch (const nlohmann::json::exception& e) {
      fail("bench --profile: LibTorch's profiler wrote a trace that is not JSON ({})", e.what());
    }
    write_file_atomic(r.profile, trace.str());
    print_profile_table(events, r.steps, per_step * 1e3);
    fmt::print(stderr, "profile: trace of {} steps written to {}\n", r.steps, r.profile);
  }
  return per_step;
}

void report_bench(const BenchRequest& r, const char* family, const std::string& prefix, const std::string& what,
                  const std::string& figures_text, nlohmann::json figures) {
  if (r.json) {
    figures["family"] = family;
    figures["what"] = what;
    figures["threads"] = r.threads;
    figures["device"] = r.device.str();
    figures["peak_rss_mb"] = static_cast<double>(peak_rss_bytes()) / 1e6;
    figures["cpu"] = cpu_text();
    fmt::print("{}\n", figures.dump());
    return;
  }
  fmt::print("{}: {}\n{}: {}, {}; CPU: {}\n", prefix, what, prefix, figures_text, peak_memory_text(r.device.is_cuda()),
             cpu_text());
}

}  // namespace spanformer::train
