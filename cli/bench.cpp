// spanformer bench: training-step or evaluation speed and memory of any family on random tokens.
#include "command.h"
#include "spanformer/util/error.h"
#include "spanformer/train/family.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_bench(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string config, mode = "train";
    train::BenchRequest request;
  };
  auto o = std::make_shared<Options>();
  auto& r = o->request;
  auto* cmd = app.add_subcommand("bench", "training-step speed and memory on random tokens");
  cmd->add_option("--config,-c", o->config, "JSON config")->required();
  cmd->add_option("--mode", o->mode, "train (step time), eval (forward only, no gradients; Transformer-XL/PAR: "
                                     "time per token with a full memory) or generate (GPT: tokens/s with and "
                                     "without the KV cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "eval", "generate"}));
  cmd->add_option("--steps", r.steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", r.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--span", r.span, "adaptive span: set every head's span z to this many tokens");
  cmd->add_option("--span-dist", r.span_dist,
                  "adaptive span, bimodal: per layer, 3 of 4 heads in [16, 256] and 1 of 4 in [2048, L] (fixed seed)")
      ->check(CLI::IsMember({"bimodal"}));
  cmd->add_option("--spans-from", r.spans_from, "adaptive span: every head's span from this checkpoint (same layers "
                                                "and heads), e.g. an imported reference model's learned spans");
  cmd->add_option("--mem-len", r.mem_len, "Transformer-XL/PAR eval mode: memory length (default: eval_mem_len)");
  cmd->add_option("--tgt-len", r.tgt_len, "Transformer-XL/PAR eval mode: segment length (default: eval_tgt_len)");
  cmd->add_option("--tokens", r.tokens, "GPT generate mode: generate this many tokens, the last at a full context "
                                       "(default: the second half of the context)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_flag("--json", r.json, "print one JSON record of the figures instead of the two text lines");
  cmd->allow_extras();
  cmd->callback([cmd, o, g, &run] {
    auto overrides = config_overrides(*cmd);
    run = [o, g, overrides] {
      auto all = execution_overrides(*g);
      all.insert(all.end(), overrides.begin(), overrides.end());
      if (o->request.tokens > 0 && o->mode != "generate") fail("bench: --tokens is for --mode generate");
      auto family = train::family_from_config_file(o->config, all);
      if (g->threads > 0) family->train().threads = g->threads;
      auto request = o->request;
      request.eval = o->mode == "eval";
      request.generate = o->mode == "generate";
      request.threads = set_threads(static_cast<int>(family->train().threads));
      request.device = train::parse_device(g->device.empty() ? "cpu" : g->device);
      family->bench(request);
    };
  });
}

}  // namespace spanformer::cli
