// spanformer bench: training-step or evaluation speed and memory of any family on random inputs. The
// common flags are here; each family's own settings come from the family table (train/registry.h).
#include <map>

#include "command.h"
#include "spanformer/train/family.h"
#include "spanformer/train/registry.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_bench(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string config, mode = "train";
    train::BenchRequest request;
    std::map<std::string, std::string> given;  // every family's settings, as given
  };
  auto o = std::make_shared<Options>();
  auto& r = o->request;
  auto* cmd = app.add_subcommand("bench", "training-step speed and memory on random inputs");
  cmd->add_option("--config,-c", o->config, "JSON config")->required();
  cmd->add_option("--mode", o->mode, "train (step time), eval (forward only, no gradients; Transformer-XL/PAR: "
                                     "time per token with a full memory) or generate (GPT: tokens/s with and "
                                     "without the KV cache)")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "eval", "generate"}));
  cmd->add_option("--steps", r.steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", r.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--profile", r.profile, "profile the timed steps (train and eval modes): a Chrome trace of every "
                                         "ATen call to this file, the operators by their own time to stderr")
      ->check(CLI::NonexistentPath | CLI::ExistingFile);
  cmd->add_flag("--json", r.json, "print one JSON record of the figures instead of the two text lines");
  // The families' settings: one option each, its help from the first family that lists it, plus who reads it.
  std::map<std::string, std::pair<std::string, std::string>> settings;  // name -> (help, families)
  std::vector<std::string> order;
  for (const auto& f : train::families())
    for (const auto& s : f.bench_settings()) {
      auto [it, added] = settings.try_emplace(s.name, s.help, f.name);
      if (added) order.push_back(s.name);
      else it->second.second += std::string(", ") + f.name;
    }
  for (const auto& name : order)
    cmd->add_option("--" + name, o->given[name], settings[name].first + " [" + settings[name].second + "]");
  cmd->allow_extras();
  cmd->callback([cmd, o, g, &run] {
    auto overrides = config_overrides(*cmd);
    for (const auto& [name, value] : o->given)
      if (cmd->count("--" + name) > 0) o->request.settings[name] = value;
    run = [o, g, overrides] {
      auto all = execution_overrides(*g);
      all.insert(all.end(), overrides.begin(), overrides.end());
      auto family = train::family_from_config_file(o->config, all);
      train::check_bench_settings(train::family_info(family->name(), o->config), o->request);
      if (g->threads > 0) family->train().threads = g->threads;
      auto request = o->request;
      request.mode = train::parse_bench_mode(o->mode);
      if (!request.profile.empty() && request.mode == train::BenchMode::kGenerate)
        fail("bench: --profile profiles training steps or evaluation (--mode train or eval), not generation");
      if (!g->device.empty()) family->train().device = g->device;
      if (request.mode == train::BenchMode::kTrain) family->check_training_step();
      request.threads = set_threads(static_cast<int>(family->train().threads));
      request.device = train::parse_device(g->device.empty() ? "cpu" : g->device);
      family->bench(request);
    };
  });
}

}  // namespace spanformer::cli
