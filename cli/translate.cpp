// spanformer translate: translations of sentences by a seq2seq checkpoint (greedy or beam search),
// from --text arguments or a file of one sentence per line (empty lines stay empty).
#include <fmt/format.h>

#include <cmath>

#include "command.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_translate(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string checkpoint, file, out;
    std::vector<std::string> texts;
    train::TranslateRequest request;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("translate", "translate sentences with a seq2seq checkpoint");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--text", o->texts, "a source sentence (repeat for several)");
  cmd->add_option("--file,-f", o->file, "a file of source sentences, one per line");
  cmd->add_option("--out,-o", o->out, "write the translations to this file (default: standard output)");
  // Given or not: the request's -1 means "the config's", which a user's value must never reach.
  auto* beam = cmd->add_option("--beam", o->request.beam, "beam width (1 = greedy; default: the config's)");
  auto* penalty =
      cmd->add_option("--length-penalty", o->request.length_penalty, "alpha of ((5 + |y|) / 6)^alpha (default: the config's)");
  cmd->callback([o, g, beam, penalty, &run] {
    run = [o, g, given_beam = beam->count() > 0, given_penalty = penalty->count() > 0] {
      if (o->texts.empty() == o->file.empty()) fail("translate: give --text or --file (one of them)");
      if (given_beam && o->request.beam < 1) fail("--beam must be positive (got {})", o->request.beam);
      if (given_penalty && !(o->request.length_penalty >= 0 && std::isfinite(o->request.length_penalty)))
        fail("--length-penalty must be a finite number >= 0 (got {})", o->request.length_penalty);
      set_threads(g->threads);
      train::Checkpoint ck(o->checkpoint);
      auto family = train::family_from_checkpoint(ck);
      family->module().to(train::parse_device(g->device.empty() ? "cpu" : g->device));
      std::vector<std::string> lines = o->texts;
      if (!o->file.empty()) {
        const std::string text = read_file(o->file);
        lines.clear();
        size_t begin = 0;
        while (begin < text.size()) {
          size_t end = text.find('\n', begin);
          if (end == std::string::npos) end = text.size();
          std::string line = text.substr(begin, end - begin);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          lines.push_back(line);
          begin = end + 1;
        }
        if (lines.empty()) fail("{}: the file is empty", o->file);
      }
      std::vector<std::string> sentences;
      for (const auto& l : lines)
        if (l.find_first_not_of(" \t") != std::string::npos) sentences.push_back(l);
      const double start = now_seconds();
      auto translated = family->need<train::Translation>().translate(sentences, o->request);
      std::string out;
      size_t k = 0;
      for (const auto& l : lines) out += (l.find_first_not_of(" \t") != std::string::npos ? translated[k++] : "") + "\n";
      if (o->out.empty()) {
        fmt::print("{}", out);
      } else {
        write_file_atomic(o->out, out);
        fmt::print(stderr, "translate: {} sentences in {:.1f} s -> {}\n", sentences.size(), now_seconds() - start, o->out);
      }
    };
  });
}

}  // namespace spanformer::cli
