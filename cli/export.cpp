// spanformer export: a checkpoint's weights in another implementation's format (the formats:
// train/formats.h).
#include <fmt/format.h>

#include "command.h"
#include "spanformer/train/formats.h"

namespace spanformer::cli {

std::string export_formats_help();  // import.cpp

void add_export(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string kind, checkpoint, out;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export", "write a checkpoint's weights in another implementation's format");
  cmd->add_option("kind", o->kind, export_formats_help())->required();
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory");  // checked with the kind
  cmd->add_option("--out,-o", o->out, "file to write (model.safetensors; torch.save format for the reference kinds; "
                                     "a directory for gpt2)")->required();
  cmd->callback([o, &run] {
    run = [o] {
      check_kind_and_file("export", o->kind, o->checkpoint, "CHECKPOINT");
      train::Checkpoint ck(o->checkpoint);
      const std::string what = train::find_weight_format(o->kind)->export_weights(ck, o->out);
      fmt::print("exported {} -> {} {}\n", o->checkpoint, o->out, what);
    };
  });
}

}  // namespace spanformer::cli
