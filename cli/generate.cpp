// spanformer generate: sampling from any family's checkpoint (temperature, top-k, top-p, seed; the gpt
// family in bfloat16 with --dtype).
#include <iostream>

#include "command.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_generate(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string checkpoint;
    train::SampleRequest request;
    uint64_t seed = 1;
    std::string dtype = "float32";
  };
  auto o = std::make_shared<Options>();
  o->request.prompt = "\n";
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--prompt,-p", o->request.prompt, "text to continue (word models: words separated by spaces)");
  // The sample streams out, so memory does not grow with it; 2^40 bounds the time (and catches numbers
  // beyond int64, which the parser would clamp to its largest value).
  cmd->add_option("--tokens,-n", o->request.tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--temperature,-t", o->request.temperature, "sampling temperature")->capture_default_str();
  cmd->add_option("--top-k,-k", o->request.top_k, "sample among the k most likely (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", o->request.top_p, "nucleus sampling: the most likely tokens up to this mass (1 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "float32, or bfloat16: the weights cast once and every step in bfloat16 "
                                       "(half the bytes a token reads; gpt family)")
      ->capture_default_str();
  cmd->callback([o, g, &run] {
    run = [o, g] {
      set_threads(g->threads);
      if (o->dtype != "float32" && o->dtype != "bfloat16")
        fail("generate --dtype must be float32 or bfloat16 (got '{}')", o->dtype);
      o->request.bfloat16 = o->dtype == "bfloat16";
      train::Checkpoint ck(o->checkpoint);
      auto family = train::family_from_checkpoint(ck, execution_overrides(*g));
      if (o->request.bfloat16 && std::string(family->name()) != "gpt")
        fail("generate --dtype bfloat16 is for the gpt family ({} is of the {} family)", ck.path(), family->name());
      const auto device = train::parse_device(g->device.empty() ? "cpu" : g->device);
      family->module().to(device);
      torch::manual_seed(o->seed);
      auto request = o->request;
      request.on_text = [](const std::string& piece) { std::cout << piece << std::flush; };
      std::cout << request.prompt << (ck.vocab().word_level ? " " : "") << std::flush;
      family->need<train::Sampling>().sample(ck.vocab(), request);
      std::cout << std::endl;
    };
  });
}

}  // namespace spanformer::cli
