// `spanformer bench --mode generate` for the gpt family (decode_bench.h): rounds of the same prompt
// length, each timing the prompt at once (prefill: its hidden states and the last token's logits), then
// the per-token steps with the KV cache and (--recompute 1) without it, for --batch rows together; a
// step is the new tokens' hidden states and their next-token logits (the output layer is a step's
// largest product at GPT-2's vocabulary).
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
  if (r.has("batch") && r.mode != BenchMode::kGenerate) fail("bench: --batch is for --mode generate (training: train.batch_size)");
  if (r.has("tokens") && r.integer("tokens", 0) < 1) fail("bench: --tokens must be >= 1 (got {})", r.integer("tokens", 0));
}

void bench_decoding(models::GptModel& model, const GptModelConfig& c, const BenchRequest& r, const char* family) {
  const int64_t tokens = r.integer("tokens", 0);  // 0 = the second half of the context
  const int64_t T = c.context, V = c.vocab_size;
  if (tokens >= T) fail("bench --tokens {}: must be below the context {}", tokens, T);
  model->eval();
  const std::string dtype = r.has("dtype") ? r.text("dtype") : "float32";
  if (dtype != "float32" && dtype != "bfloat16") fail("bench: --dtype must be float32 or bfloat16 (got '{}')", dtype);
  if (dtype == "bfloat16") model->to(torch::kBFloat16);
  model->lay_out_for_decoding();
  const int64_t recompute = r.integer("recompute", 1);
  if (recompute != 0 && recompute != 1) fail("bench: --recompute must be 0 or 1 (got {})", recompute);
  torch::NoGradGuard no_grad;
  const int64_t prompt = tokens > 0 ? T - tokens : std::max<int64_t>(1, T / 2), steps = T - prompt;
  const int64_t B = r.integer("batch", 1);
  if (B < 1) fail("bench: --batch must be >= 1 (got {})", B);
  // One round: the prompt (B, prompt) at once with its last token's logits (prefill), then the steps,
  // each (B, 1) with its next-token logits, as generation reads them. Returns {prefill, decoding} tokens/s.
  auto run = [&](models::GptDecoder& d) {
    d.history.clear();
    d.start = 0;
    auto x = torch::randint(V, {B, prompt}, torch::kLong).to(r.device);
    double t0 = now_seconds();
    model->logits(model->extend(x, d).narrow(1, prompt - 1, 1)).sum().item<double>();  // (B, 1, V), done
    const double prefill = static_cast<double>(B * prompt) / (now_seconds() - t0);
    t0 = now_seconds();
    torch::Tensor last;
    for (int64_t i = 0; i < steps; ++i)
      last = model->logits(model->extend(torch::randint(V, {B, 1}, torch::kLong).to(r.device), d));  // (B, 1, V)
    last.sum().item<double>();  // the device's work done
    return std::pair<double, double>{prefill, static_cast<double>(B * steps) / (now_seconds() - t0)};
  };
  double cached = 0, recomputed = 0, prefill = 0;
  for (int64_t i = 0; i < r.warmup + r.steps; ++i) {
    models::GptDecoder with_cache, without;
    without.use_cache = false;
    const auto [p, a] = run(with_cache);
    const double b = recompute ? run(without).second : 0.0;
    fmt::print(stderr, "  round {}/{}: prefill {:.0f} tokens/s, then {:.0f} tokens/s with the cache, {:.0f} without{}\n",
               i + 1, r.warmup + r.steps, p, a, b, i < r.warmup ? " (warmup)" : "");
    if (i >= r.warmup) {
      const double w = 1.0 / static_cast<double>(r.steps);
      cached += a * w, recomputed += b * w, prefill += p * w;
    }
  }
  nlohmann::json fields{{"mode", "generate"}, {"dtype", dtype}, {"batch", B}, {"prefill_tokens_per_s", prefill},
                        {"cached_tokens_per_s", cached},
                        {"recomputed_tokens_per_s", recompute ? nlohmann::json(recomputed) : nlohmann::json()},
                        {"attention", attention::causal_kind_name(c.attention)}};
  report_bench(r, family, "bench",
               fmt::format("generate, {} layers, H {}, K {}, T {}, attention {}, {}, batch {}, tokens {} .. {} after a prompt of {}",
                           c.n_layer, c.d_model, c.n_head, T, attention::causal_kind_name(c.attention), dtype, B,
                           prompt + 1, T, prompt),
               fmt::format("prefill {:.0f} tokens/s, then {:.1f} tokens/s with the KV cache{}", prefill, cached,
                           recompute ? fmt::format(", {:.1f} tokens/s recomputing the context ({:.2f}x)", recomputed,
                                                   cached / recomputed)
                                     : std::string()),
               fields);
}

}  // namespace spanformer::train
