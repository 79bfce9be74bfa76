// `spanformer bench --mode generate` for the gpt family (decode_bench.h): rounds of the same prompt
// length, each timing the per-token steps with the KV cache and (--recompute 1) without it; a step is
// the new token's hidden state and its next-token logits (the output layer is a step's largest product
// at GPT-2's vocabulary).
#include "decode_bench.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"
#include "train/families/families.h"

namespace spanformer::train {

void check_decoding_settings(const BenchRequest& r) {
  if (r.has("tokens") && r.mode != BenchMode::kGenerate) fail("bench: --tokens is for --mode generate");
  if (r.has("dtype") && r.mode != BenchMode::kGenerate) fail("bench: --dtype is for --mode generate (training: train.amp)");
  if (r.has("recompute") && r.mode != BenchMode::kGenerate) fail("bench: --recompute is for --mode generate");
  if (r.has("tokens") && r.integer("tokens", 0) < 1) fail("bench: --tokens must be >= 1 (got {})", r.integer("tokens", 0));
}

void bench_decoding(models::GptModel& model, const GptModelConfig& c, const BenchRequest& r, const char* family) {
  const int64_t tokens = r.integer("tokens", 0);  // 0 = the second half of the context
  const int64_t T = c.context, V = c.vocab_size;
  if (tokens >= T) fail("bench --tokens {}: must be below the context {}", tokens, T);
  model->eval();
  model->lay_out_for_decoding();
  const std::string dtype = r.has("dtype") ? r.text("dtype") : "float32";
  if (dtype != "float32" && dtype != "bfloat16") fail("bench: --dtype must be float32 or bfloat16 (got '{}')", dtype);
  if (dtype == "bfloat16") model->to(torch::kBFloat16);
  const int64_t recompute = r.integer("recompute", 1);
  if (recompute != 0 && recompute != 1) fail("bench: --recompute must be 0 or 1 (got {})", recompute);
  torch::NoGradGuard no_grad;
  const int64_t prompt = tokens > 0 ? T - tokens : std::max<int64_t>(1, T / 2), steps = T - prompt;
  auto run = [&](models::GptDecoder& d) {
    d.history.clear();
    d.start = 0;
    model->extend(torch::randint(V, {1, prompt}, torch::kLong).to(r.device), d);
    const double t0 = now_seconds();
    torch::Tensor last;
    for (int64_t i = 0; i < steps; ++i)  // each step's next-token logits, as generation reads them
      last = model->logits(model->extend(torch::randint(V, {1, 1}, torch::kLong).to(r.device), d));  // (1, 1, V)
    last.sum().item<double>();  // the device's work done
    return static_cast<double>(steps) / (now_seconds() - t0);
  };
  double cached = 0, recomputed = 0;
  for (int64_t i = 0; i < r.warmup + r.steps; ++i) {
    models::GptDecoder with_cache, without;
    without.use_cache = false;
    const double a = run(with_cache), b = recompute ? run(without) : 0.0;
    fmt::print(stderr, "  round {}/{}: {:.0f} tokens/s with the cache, {:.0f} without{}\n", i + 1, r.warmup + r.steps,
               a, b, i < r.warmup ? " (warmup)" : "");
    if (i >= r.warmup) {
      const double w = 1.0 / static_cast<double>(r.steps);
      cached += a * w, recomputed += b * w;
    }
  }
  nlohmann::json fields{{"mode", "generate"}, {"dtype", dtype}, {"cached_tokens_per_s", cached},
                        {"recomputed_tokens_per_s", recompute ? nlohmann::json(recomputed) : nlohmann::json()},
                        {"attention", attention::causal_kind_name(c.attention)}};
  report_bench(r, family, "bench",
               fmt::format("generate, {} layers, H {}, K {}, T {}, attention {}, {}, tokens {} .. {} after a prompt of {}",
                           c.n_layer, c.d_model, c.n_head, T, attention::causal_kind_name(c.attention), dtype,
                           prompt + 1, T, prompt),
               fmt::format("{:.1f} tokens/s with the KV cache{}", cached,
                           recompute ? fmt::format(", {:.1f} tokens/s recomputing the context ({:.2f}x)", recomputed,
                                                   cached / recomputed)
                                     : std::string()),
               fields);
}

}  // namespace spanformer::train
