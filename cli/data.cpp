// spanformer data: prepare corpora (bytes: prepare, get; words: words, cutoffs), and GPT-2's byte-level BPE
// (tokenize).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "command.h"
#include "spanformer/data/byte_bpe.h"
#include "spanformer/data/corpus.h"
#include "spanformer/data/download.h"
#include "spanformer/data/words.h"
#include "spanformer/nn/adaptive_softmax.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_data(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string input, out, name, url, dir;
    bool crlf = false;
    data::WordPrepareOptions words;
    std::vector<double> coverage{0.8, 0.9, 0.95};
    int64_t round_to = 1000;
    std::string tokenizer, text_file;
    bool decode = false;
  };
  auto o = std::make_shared<Options>();
  auto* data_cmd = app.add_subcommand("data", "prepare corpora");
  data_cmd->require_subcommand(1);

  auto* prepare = data_cmd->add_subcommand("prepare", "byte-level preparation of any file (90/5/5 split)");
  prepare->add_option("file", o->input, "text file")->required();
  prepare->add_option("--out,-o", o->out, "output directory")->required();
  prepare->add_flag("--crlf-to-lf", o->crlf, "turn CRLF line ends into LF first");
  prepare->callback([o, &run] {
    run = [o] {
      const double start = now_seconds();
      data::PrepareOptions options;
      options.crlf_to_lf = o->crlf;
      auto s = data::prepare_bytes(o->input, o->out, options);
      fmt::print("prepared {} ({} bytes) in {:.1f} s: train {} / valid {} / test {} tokens, vocabulary {}, "
                 "{} unseen bytes dropped -> {}\n",
                 o->input, s.input_bytes, now_seconds() - start, s.train_tokens, s.valid_tokens, s.test_tokens,
                 s.vocab_size, s.dropped, o->out);
      fmt::print(stderr, "peak memory {:.0f} MB\n", peak_rss_bytes() / 1e6);
    };
  });

  auto* get = data_cmd->add_subcommand("get", "download, verify and prepare a reference data set");
  get->add_option("name", o->name, fmt::format("{}", fmt::join(data::known_dataset_names(), " | ")))->required();
  get->add_option("--out,-o", o->out, "output directory (default data/NAME)");
  get->add_option("--url", o->url, "another address: the zip (mirror, or file:///path/x.zip), or for ptb the folder of its files");
  get->callback([o, &run] {
    run = [o] { data::get_dataset(o->name, o->out.empty() ? "data/" + o->name : o->out, o->url); };
  });

  auto* words = data_cmd->add_subcommand("words", "word-level preparation of WikiText-style files (<eos> per line)");
  words->add_option("dir", o->dir, "directory with wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens");
  words->add_option("--train", o->words.train, "training file (default DIR/wiki.train.tokens)");
  words->add_option("--valid", o->words.valid, "validation file (default DIR/wiki.valid.tokens)");
  words->add_option("--test", o->words.test, "test file (default DIR/wiki.test.tokens)");
  words->add_option("--out,-o", o->out, "output directory")->required();
  words->add_flag("--vocab-from-all", o->words.vocab_from_all,
                  "count the vocabulary on all three splits (the reference's WikiText-2 rule)");
  words->add_option("--min-freq", o->words.min_freq, "rarer words become <unk>");
  words->add_option("--max-size", o->words.max_size, "keep at most this many words");
  words->callback([o, &run] {
    run = [o] {
      data::WordPrepareOptions w = o->words;
      auto pick = [&](std::string& f, const char* name) {
        if (!f.empty()) return;
        if (o->dir.empty()) fail("data words: give DIR or --train/--valid/--test");
        f = o->dir + "/wiki." + name + ".tokens";
        if (!file_exists(f) && std::string(name) == "train")
          fail("{} not found (WikiText-2's train split is not on this machine? pass --train FILE, e.g. the valid split)", f);
      };
      pick(w.train, "train");
      pick(w.valid, "valid");
      pick(w.test, "test");
      auto s = data::prepare_words(w, o->out);
      fmt::print("prepared {}: vocabulary {} words (counted on {}), train {} / valid {} / test {} tokens, "
                 "<unk> substitutions {} / {} / {}\n",
                 o->out, s.vocab_size, w.vocab_from_all ? "all splits" : "train", s.train_tokens, s.valid_tokens,
                 s.test_tokens, s.train_unk, s.valid_unk, s.test_unk);
      if (s.same_train_valid)
        fmt::print("note: train and valid are the same file: validation measures fit, not generalisation; "
                   "report the test split\n");
    };
  });

  auto* tokenize = data_cmd->add_subcommand(
      "tokenize", "GPT-2's byte-level BPE: a file's bytes -> ids (one line, spaces), or ids -> bytes (--decode)");
  tokenize->add_option("--tokenizer", o->tokenizer,
                       "tokenizer.json, or a directory holding tokenizer.json or vocab.json + merges.txt")->required();
  tokenize->add_option("file", o->text_file, "the bytes to encode (with --decode: ids separated by white space)")->required();
  tokenize->add_flag("--decode", o->decode, "ids -> bytes");
  tokenize->callback([o, &run] {
    run = [o] {
      const auto bpe = data::load_byte_bpe(o->tokenizer);
      const std::string input = read_file(o->text_file);
      if (!o->decode) {
        fmt::print("{}\n", fmt::join(bpe->encode(input), " "));
        return;
      }
      std::vector<int64_t> ids;
      size_t at = 0;
      while ((at = input.find_first_not_of(" \t\r\n", at)) != std::string::npos) {
        const size_t end = std::min(input.find_first_of(" \t\r\n", at), input.size());
        const std::string word = input.substr(at, end - at);
        char* stop = nullptr;
        errno = 0;
        const long long id = std::strtoll(word.c_str(), &stop, 10);
        if (*stop != '\0' || errno != 0) fail("data tokenize --decode: '{}' in {} is not an id", word, o->text_file);
        ids.push_back(id);
        at = end;
      }
      const std::string bytes = bpe->decode(ids);
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    };
  });

  auto* cutoffs = data_cmd->add_subcommand("cutoffs", "propose adaptive-softmax cutoffs from a word-level directory's counts");
  cutoffs->add_option("dir", o->dir, "prepared word-level directory")->required();
  cutoffs->add_option("--coverage", o->coverage, "share of training tokens before each cutoff")->capture_default_str();
  cutoffs->add_option("--round", o->round_to, "round cutoffs up to a multiple of this")->capture_default_str();
  cutoffs->callback([o, &run] {
    run = [o] {
      auto counts = data::read_word_counts(o->dir);
      double total = 0;
      for (auto c : counts) total += static_cast<double>(c);
      if (!(total > 0)) fail("{}/counts.txt counts no training tokens: no cutoffs to propose", o->dir);
      auto cut = nn::propose_cutoffs(counts, o->coverage, o->round_to);
      std::vector<int64_t> bounds{0};
      bounds.insert(bounds.end(), cut.begin(), cut.end());
      bounds.push_back(static_cast<int64_t>(counts.size()));
      for (size_t i = 0; i + 1 < bounds.size(); ++i) {
        double share = 0;
        for (int64_t k = bounds[i]; k < bounds[i + 1]; ++k) share += static_cast<double>(counts[k]);
        fmt::print("cluster {}: ids [{}, {}) {} words, {:.2f}% of training tokens\n", i, bounds[i], bounds[i + 1],
                   bounds[i + 1] - bounds[i], 100 * share / total);
      }
      fmt::print("cutoffs [{}]  (model.adaptive = true, model.cutoffs = [{}])\n", fmt::join(cut, ", "),
                 fmt::join(cut, ", "));
    };
  });
}

}  // namespace spanformer::cli
