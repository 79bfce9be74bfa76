// spanformer import: another implementation's weights into a spanformer checkpoint.
#include <fmt/format.h>

#include "command.h"
#include "spanformer/io/safetensors.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/family.h"
#include "spanformer/util/io.h"
#include "spanformer/util/error.h"

namespace spanformer::cli {

void print_spans(const std::vector<std::vector<double>>& spans);  // spans.cpp

void add_import(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string kind, model, config, vocab, out, level = "byte";
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("import", "convert another implementation's weights into a spanformer checkpoint");
  cmd->add_option("kind", o->kind, "safetensors (written by `spanformer export safetensors`, any family), "
                                   "gpt2 (a directory transformers' save_pretrained wrote for a GPT2LMHeadModel), "
                                   "adaptive-span (facebookresearch/adaptive-span's state_dict) or transformer-xl "
                                   "(kimiyoung/transformer-xl's MemTransformerLM state_dict)")->required();
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
      if (o->kind == "safetensors") {
        if (!o->config.empty() || !o->vocab.empty() || !overrides.empty())
          fail("import safetensors: the file carries its config and vocabulary; --config, --vocab and overrides "
               "are not used");
        if (!train::import_safetensors(o->model, o->out))
          fmt::print(stderr, "spanformer: note: {} carries no {} checksum (not written by spanformer, or edited): its "
                             "tensors are taken as they are\n", o->model, io::kSafetensorsChecksumKey);
        fmt::print("imported {} -> {}\n", o->model, o->out);
        return;
      }
      if (o->kind == "gpt2") {
        if (!o->config.empty() || !overrides.empty())
          fail("import gpt2: the directory's config.json describes the model; --config and overrides are not used");
        if (!train::import_gpt2(o->model, o->vocab, o->level, o->out))
          fmt::print(stderr, "spanformer: note: {}/model.safetensors carries no {} checksum (not written by spanformer, "
                             "or edited): its tensors are taken as they are\n", o->model, io::kSafetensorsChecksumKey);
        fmt::print("imported {} -> {}\n", o->model, o->out);
        return;
      }
      if (train::has_checkpoint_marker(o->model))
        fail("import {}: {} is a spanformer checkpoint already (import reads the reference's state_dict)", o->kind, o->model);
      if (o->config.empty() || o->vocab.empty()) fail("import {}: --config and --vocab are required", o->kind);
      auto family = train::family_from_config_file(o->config, overrides);
      auto vocab = o->level == "word" ? data::read_word_vocab(o->vocab) : data::read_vocab(o->vocab);
      family->set_vocab_size(vocab.size(), o->vocab);
      family->validate();
      family->build();
      family->need<train::ReferenceWeights>("import from " + o->kind).import_weights(o->kind, o->model);
      train::save_weights(*family, vocab, o->out);
      fmt::print("imported {} -> {}\n", o->model, o->out);
      if (const auto* spans = family->as<train::Spans>()) print_spans(spans->spans());
    };
  });
}

}  // namespace spanformer::cli
