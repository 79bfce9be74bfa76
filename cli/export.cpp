// spanformer export: a checkpoint's weights in another implementation's format.
#include <fmt/format.h>

#include "command.h"
#include "spanformer/train/family.h"

namespace spanformer::cli {

void add_export(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string kind, checkpoint, out;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export", "write a checkpoint's weights in another implementation's format");
  cmd->add_option("kind", o->kind, "adaptive-span or transformer-xl (a state_dict the Python reference loads)")->required();
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--out,-o", o->out, "file to write (torch.save format)")->required();
  cmd->callback([o, &run] {
    run = [o] {
      train::Checkpoint ck(o->checkpoint);
      auto family = train::family_from_checkpoint(ck);
      family->export_weights(o->kind, o->out);
      fmt::print("exported {} -> {} (load in Python with model.load_state_dict(torch.load(path)))\n", o->checkpoint,
                 o->out);
    };
  });
}

}  // namespace spanformer::cli
