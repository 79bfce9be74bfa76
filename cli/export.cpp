// spanformer export: a checkpoint's weights in another implementation's format.
#include <fmt/format.h>

#include "command.h"
#include "spanformer/train/family.h"

namespace spanformer::cli {

// model.safetensors -> model.json (the config, beside the weights).
std::string config_path_beside(const std::string& out) {
  const std::string suffix = ".safetensors";
  const bool has_suffix = out.size() > suffix.size() && out.compare(out.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (has_suffix ? out.substr(0, out.size() - suffix.size()) : out) + ".json";
}

void add_export(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string kind, checkpoint, out;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export", "write a checkpoint's weights in another implementation's format");
  cmd->add_option("kind", o->kind, "safetensors (every family: Hugging Face's format, config JSON beside it), "
                                   "gpt2 (a gpt model as Hugging Face transformers' GPT2LMHeadModel: a directory), "
                                   "adaptive-span or transformer-xl (a state_dict the Python reference loads)")->required();
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory");  // checked with the kind
  cmd->add_option("--out,-o", o->out, "file to write (model.safetensors; torch.save format for the reference kinds; "
                                     "a directory for gpt2)")->required();
  cmd->callback([o, &run] {
    run = [o] {
      check_kind_and_file("export", o->kind, o->checkpoint, "CHECKPOINT");
      train::Checkpoint ck(o->checkpoint);
      if (o->kind == "safetensors") {
        const std::string config = config_path_beside(o->out);
        train::export_safetensors(ck, o->out, config);
        fmt::print("exported {} -> {} (config: {})\n", o->checkpoint, o->out, config);
        return;
      }
      if (o->kind == "gpt2") {
        train::export_gpt2(ck, o->out);
        fmt::print("exported {} -> {} (transformers: GPT2LMHeadModel.from_pretrained(\"{}\"))\n", o->checkpoint, o->out,
                   o->out);
        return;
      }
      auto family = train::family_from_checkpoint(ck);
      family->need<train::ReferenceWeights>("export to " + o->kind).export_weights(o->kind, o->out);
      fmt::print("exported {} -> {} (load in Python with model.load_state_dict(torch.load(path)))\n", o->checkpoint,
                 o->out);
    };
  });
}

}  // namespace spanformer::cli
