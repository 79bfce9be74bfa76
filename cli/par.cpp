// spanformer par: the PAR architecture search's own commands (derive a plain model, draw the search).
#include <algorithm>

#include <fmt/format.h>

#include "command.h"
#include "spanformer/models/par.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/viz/search_plot.h"
#include "spanformer/util/run_paths.h"

namespace spanformer::cli {

void add_par(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string checkpoint, out, rule = "par", run_dir, picture = "search.png";
    double ratio = 5.0;
  };
  auto o = std::make_shared<Options>();
  auto* par = app.add_subcommand("par", "PAR architecture search: derive a plain model, draw the search");
  par->require_subcommand(1);

  auto* derive = par->add_subcommand("derive", "write the plain model config a trained super-network chose");
  derive->add_option("checkpoint", o->checkpoint, "super-network checkpoint or run directory")->required();
  derive->add_option("--out,-o", o->out, "config to write (JSON)")->required();
  derive->add_option("--rule", o->rule, "argmax (per block) or par (attention only in the lower two thirds, "
                                        "total:attention = ratio)")->capture_default_str();
  derive->add_option("--ratio,-p", o->ratio, "total:attention block ratio of the par rule")->capture_default_str();
  derive->callback([o, &run] {
    run = [o] {
      if (o->rule != "argmax" && o->rule != "par") fail("--rule must be argmax or par (got '{}')", o->rule);
      train::Checkpoint ck(o->checkpoint);
      auto family = train::family_from_checkpoint(ck);
      auto& search = family->need<train::ArchitectureSearch>();  // "the gpt family has no architecture search"
      const auto probs = search.block_probs();  // per block {attention, feed-forward, identity}
      if (probs.empty()) fail("{} is not a super-network (model.search is false)", o->checkpoint);
      const std::string layers =
          o->rule == "argmax" ? models::par::derive_argmax(probs) : models::par::derive_par(probs, o->ratio);
      auto j = search.derived_config(layers);
      j["description"] = fmt::format("PAR model derived from {} by the {} rule{}", o->checkpoint, o->rule,
                                     o->rule == "par" ? fmt::format(" (ratio {})", o->ratio) : "");
      write_file_atomic(o->out, j.dump(2) + "\n");
      for (size_t b = 0; b < probs.size(); ++b)
        fmt::print("block {:>2}: P(attention) {:.3f}  P(feed-forward) {:.3f}  P(identity) {:.3f}\n", b, probs[b][0],
                   probs[b][1], probs[b][2]);
      const size_t attn = std::count(layers.begin(), layers.end(), 'a');
      fmt::print("derived layers \"{}\" ({} blocks, {} attention) -> {}\n", layers, layers.size(), attn, o->out);
      if (attn == 0)
        fmt::print(stderr, "spanformer: warning: the derived model has no attention block: it cannot look at any "
                           "earlier token (use --rule par, or search longer)\n");
    };
  });

  auto* plot = par->add_subcommand("plot", "draw P(block type) per block against step, and the final choice");
  plot->add_option("run", o->run_dir, "run directory of a super-network (its log.jsonl)")->required();
  plot->add_option("--out,-o", o->picture, "PNG to write")->capture_default_str();
  plot->callback([o, &run] {
    run = [o] {
      const std::string run_log = RunPaths(o->run_dir).log();
      const std::string log = file_exists(run_log) ? run_log : o->run_dir;
      auto history = viz::read_search_history(log);
      viz::write_search_plot(o->picture, history, fmt::format("PAR search: {}", o->run_dir));
      fmt::print("search picture: {} ({} records, {} blocks)\n", o->picture, history.steps.size(), history.probs[0].size());
    };
  });
}

}  // namespace spanformer::cli
