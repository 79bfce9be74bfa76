// spanformer attention: a picture of what a checkpoint's model attends to (the ViT family: the class
// token's attention to the patches of chosen images, by attention rollout or one layer / head; the
// seq2seq family: alignment heat maps, source x target, of chosen sentences; the language models
// (adaptive span, Transformer-XL / PAR, GPT): a text's last tokens over the distances they read).
#include <fmt/format.h>

#include "command.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_attention(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string checkpoint, data;
    train::AttentionRequest request;
  };
  auto o = std::make_shared<Options>();
  o->request.out = "attention.png";
  auto* cmd = app.add_subcommand("attention", "draw a model's attention for chosen inputs (PNG)");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--image", o->request.indices, "ViT: image indices of --split (repeat or list: --image 0 1 2)");
  cmd->add_option("--pair", o->request.indices, "seq2seq: sentence-pair indices of --split (repeat or list)");
  cmd->add_option("--text", o->request.texts,
                  "seq2seq: source sentences to translate and draw (repeat); language models: the text whose last tokens are drawn");
  cmd->add_option("--split", o->request.split, "train | valid | test")->capture_default_str();
  // -1 in the request means "not chosen"; a user's value must be an index.
  cmd->add_option("--layer", o->request.layer, "one layer (default: every layer: ViT by attention rollout, others a panel each)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--head", o->request.head, "one head (default: the heads' mean; language models with --layer: a panel per head)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--data", o->data, "image set or pairs file (default: the one the model was trained on)");
  cmd->add_option("--out,-o", o->request.out, "PNG to write")->capture_default_str();
  cmd->callback([o, g, &run] {
    run = [o, g] {
      set_threads(g->threads);
      train::Checkpoint ck(o->checkpoint);
      auto family = train::family_from_checkpoint(ck);
      if (!o->data.empty()) family->train().data = o->data;
      if (!o->request.texts.empty() && !o->request.indices.empty()) fail("attention: give --text or --pair/--image, not both");
      o->request.vocab = &ck.vocab();
      family->need<train::AttentionPictures>().draw_attention(o->request);
      fmt::print("attention picture: {}\n", o->request.out);
    };
  });
}

}  // namespace spanformer::cli
