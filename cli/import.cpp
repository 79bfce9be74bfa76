// spanformer import: another implementation's weights into a spanformer checkpoint (the formats:
// train/formats.h).
#include <fmt/format.h>

#include "command.h"
#include "spanformer/train/formats.h"

namespace spanformer::cli {

void print_spans(const std::vector<std::vector<double>>& spans);  // spans.cpp

namespace {
// "a (what a reads), b (...) or c (...)"
std::string formats_help(std::string train::WeightFormat::*what) {
  const auto& formats = train::weight_formats();
  std::string help;
  for (size_t i = 0; i < formats.size(); ++i) {
    if (i > 0) help += i + 1 == formats.size() ? " or " : ", ";
    help += fmt::format("{} ({})", formats[i].name, formats[i].*what);
  }
  return help;
}
}  // namespace

std::string import_formats_help() { return formats_help(&train::WeightFormat::reads); }
std::string export_formats_help() { return formats_help(&train::WeightFormat::writes); }

void add_import(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string kind, model, config, vocab, out, level = "byte";
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("import", "convert another implementation's weights into a spanformer checkpoint");
  cmd->add_option("kind", o->kind, import_formats_help())->required();
  cmd->add_option("model", o->model, "the safetensors or state_dict file, or the gpt2 directory (see docs/usage.md)");
  cmd->add_option("--config,-c", o->config, "spanformer config describing the model (reference kinds)");
  cmd->add_option("--vocab", o->vocab, "the model's vocabulary, in id order (vocab.txt: a byte value or <eos> per "
                                       "line; words.txt with --vocab-level word; reference kinds, and gpt2 "
                                       "directories without vocab.txt)");
  cmd->add_option("--vocab-level", o->level, "byte or word")->check(CLI::IsMember({"byte", "word"}))->capture_default_str();
  cmd->add_option("--out,-o", o->out, "spanformer checkpoint to write")->required();
  cmd->allow_extras();
  cmd->callback([cmd, o, &run] {
    auto overrides = config_overrides(*cmd);
    run = [o, overrides] {
      check_kind_and_file("import", o->kind, o->model, "FILE");
      const auto result = train::find_weight_format(o->kind)->import_weights(
          {o->model, o->config, o->vocab, o->level, overrides, o->out});
      if (!result.note.empty()) fmt::print(stderr, "spanformer: note: {}\n", result.note);
      fmt::print("imported {} -> {}\n", o->model, o->out);
      if (!result.spans.empty()) print_spans(result.spans);
    };
  });
}

}  // namespace spanformer::cli
