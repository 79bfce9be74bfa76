// spanformer train: any family's config + overrides, on the one runner (train/runner.h).
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "command.h"
#include "spanformer/dist/group.h"
#include "spanformer/train/runner.h"

namespace spanformer::cli {

void add_train(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string config, data, out = "runs/default", init;
    bool resume = false, overwrite = false, quiet = false;
    int64_t stop_after = -1;
    int nproc = 1;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("train", "train a model of any family (config file + --key=value overrides)");
  cmd->add_option("--config,-c", o->config, "JSON config (configs/*.json, configs/xl/*.json)")->required();
  cmd->add_option("--data", o->data, "prepared data directory (overrides train.data)");
  cmd->add_option("--out,-o", o->out, "run directory: config.json, log.jsonl, checkpoint.pt, best.pt")->capture_default_str();
  auto* resume = cmd->add_flag("--resume", o->resume, "continue from OUT/checkpoint.pt (exactly where it stopped)");
  cmd->add_flag("--overwrite", o->overwrite, "start a new run in OUT even if it holds one (its checkpoints are replaced)")
      ->excludes(resume);
  cmd->add_option("--init", o->init, "start a new run from the weights of this checkpoint (e.g. an imported model)");
  cmd->add_option("--stop-after", o->stop_after, "stop with a checkpoint after this many steps of this session");
  cmd->add_option("--nproc-per-node", o->nproc, "data-parallel: start N local worker processes (Gloo on loopback); "
                                                "multi-node jobs use torchrun/SLURM variables instead");
  cmd->add_flag("--quiet", o->quiet, "no progress lines");
  cmd->allow_extras();
  cmd->callback([cmd, o, g, &run] {
    auto overrides = config_overrides(*cmd);
    run = [o, g, overrides] {
      auto family = train::family_from_config_file(o->config, overrides);
      auto& tc = family->train();
      if (!o->data.empty()) tc.data = o->data;
      if (g->threads > 0) tc.threads = g->threads;
      if (!g->device.empty()) tc.device = g->device;
      family->validate();
      family->check_training_step();
      if (o->nproc > 1) train::check_batch_splits(tc, o->nproc);  // before starting workers that would all fail
      if (launch_workers(o->nproc, g->argv)) return;
      dist::GroupOptions group_options;
      group_options.timeout_seconds = tc.dist_timeout;
      group_options.backend = tc.dist_backend;
      group_options.cuda = tc.device.rfind("cuda", 0) == 0;
      auto group = dist::Group::from_env(group_options);
      tc.device = dist::process_device(tc.device, group.get());  // "cuda": this process's GPU (LOCAL_RANK)
      if (group && tc.threads == 0 && std::getenv("LOCAL_WORLD_SIZE")) {
        // Share the cores among the local workers.
        const int local_world = std::max(1, std::atoi(std::getenv("LOCAL_WORLD_SIZE")));
        tc.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_world);
      }
      const bool main = !group || group->is_main();
      train::RunOptions options;
      if (main)
        options.on_started = [&family] {
          fmt::print("spanformer: {} config {}\n", family->name(), family->config_json().dump());
          std::fflush(stdout);
        };
      options.out_dir = o->out;
      options.resume = o->resume;
      options.overwrite = o->overwrite;
      options.command_line = g->argv;
      options.progress = !o->quiet;
      options.stop_after = o->stop_after;
      options.init_from = o->init;
      options.group = group;
      auto r = train::run_training(*family, options);
      if (main && r.session_steps == 0)
        fmt::print("{}/checkpoint.pt is already at step {}: nothing to train (raise nb_steps to continue)\n", o->out,
                   r.steps);
      else if (main && !r.evaluated)
        fmt::print("stopped at step {} before this session's first evaluation; checkpoint {}/checkpoint.pt\n", r.steps,
                   o->out);
      else if (main)
        fmt::print("trained {} steps: train {:.4f} {}, valid {:.4f} {}; checkpoint {}/checkpoint.pt\n", r.steps,
                   r.last_train, metrics::unit_name(r.unit), r.last_valid, metrics::unit_name(r.unit), o->out);
      if (r.interrupted) std::exit(130);
    };
  });
}

}  // namespace spanformer::cli
