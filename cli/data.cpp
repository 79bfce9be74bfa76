// spanformer data: prepare corpora (bytes: prepare, get; words: words, cutoffs).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command.h"
#include "spanformer/data/corpus.h"
#include "spanformer/data/download.h"
#include "spanformer/data/words.h"
#include "spanformer/nn/adaptive_softmax.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {

void add_data(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {

    auto* data_cmd = app.add_subcommand("data", "prepare corpora");
    data_cmd->require_subcommand(1);
    static std::string input, out_dir, name, url;
    static bool crlf = false;
    auto* prepare = data_cmd->add_subcommand("prepare", "byte-level preparation of any file (90/5/5 split)");
    prepare->add_option("file", input, "text file")->required();
    prepare->add_option("--out,-o", out_dir, "output directory")->required();
    prepare->add_flag("--crlf-to-lf", crlf, "turn CRLF line ends into LF first");
    prepare->callback([&run] {
      run = [] {
        const double start = now_seconds();
        data::PrepareOptions options;
        options.crlf_to_lf = crlf;
        auto s = data::prepare_bytes(input, out_dir, options);
        fmt::print("prepared {} ({} bytes) in {:.1f} s: train {} / valid {} / test {} tokens, vocabulary {}, "
                   "{} unseen bytes dropped -> {}\n",
                   input, s.input_bytes, now_seconds() - start, s.train_tokens, s.valid_tokens, s.test_tokens,
                   s.vocab_size, s.dropped, out_dir);
        fmt::print(stderr, "peak memory {:.0f} MB\n", peak_rss_bytes() / 1e6);
      };
    });
    auto* get = data_cmd->add_subcommand("get", "download, verify and prepare enwik8 or text8");
    get->add_option("name", name, "enwik8 | text8")->required();
    get->add_option("--out,-o", out_dir, "output directory (default data/NAME)");
    get->add_option("--url", url, "another address for the zip (mirror, or file:///path)");
    get->callback([&run] {
      run = [] { data::get_dataset(name, out_dir.empty() ? "data/" + name : out_dir, url); };
    });
  {
    static data::WordPrepareOptions options;
    static std::string dir, out;
    auto* cmd = data_cmd->add_subcommand("words", "word-level preparation of WikiText-style files (<eos> per line)");
    cmd->add_option("dir", dir, "directory with wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens");
    cmd->add_option("--train", options.train, "training file (default DIR/wiki.train.tokens)");
    cmd->add_option("--valid", options.valid, "validation file (default DIR/wiki.valid.tokens)");
    cmd->add_option("--test", options.test, "test file (default DIR/wiki.test.tokens)");
    cmd->add_option("--out,-o", out, "output directory")->required();
    cmd->add_flag("--vocab-from-all", options.vocab_from_all, "count the vocabulary on all three splits (the reference's WikiText-2 rule)");
    cmd->add_option("--min-freq", options.min_freq, "rarer words become <unk>");
    cmd->add_option("--max-size", options.max_size, "keep at most this many words");
    cmd->callback([&run] {
      run = [] {
        data::WordPrepareOptions o = options;
        auto pick = [&](std::string& f, const char* name) {
          if (!f.empty()) return;
          if (dir.empty()) fail("data words: give DIR or --train/--valid/--test");
          f = dir + "/wiki." + name + ".tokens";
          if (!file_exists(f) && std::string(name) == "train")
            fail("{} not found (WikiText-2's train split is not on this machine? pass --train FILE, e.g. the valid split)", f);
        };
        pick(o.train, "train");
        pick(o.valid, "valid");
        pick(o.test, "test");
        auto s = data::prepare_words(o, out);
        fmt::print("prepared {}: vocabulary {} words (counted on {}), train {} / valid {} / test {} tokens, "
                   "<unk> substitutions {} / {} / {}\n",
                   out, s.vocab_size, o.vocab_from_all ? "all splits" : "train", s.train_tokens, s.valid_tokens,
                   s.test_tokens, s.train_unk, s.valid_unk, s.test_unk);
        if (s.same_train_valid)
          fmt::print("note: train and valid are the same file: validation measures fit, not generalisation; "
                     "report the test split\n");
      };
    });
  }
  {
    static std::string dir;
    static std::vector<double> coverage{0.8, 0.9, 0.95};
    static int64_t round_to = 1000;
    auto* cmd = data_cmd->add_subcommand("cutoffs", "propose adaptive-softmax cutoffs from a word-level directory's counts");
    cmd->add_option("dir", dir, "prepared word-level directory")->required();
    cmd->add_option("--coverage", coverage, "share of training tokens before each cutoff")->capture_default_str();
    cmd->add_option("--round", round_to, "round cutoffs up to a multiple of this")->capture_default_str();
    cmd->callback([&run] {
      run = [] {
        auto counts = data::read_word_counts(dir);
        auto cutoffs = nn::propose_cutoffs(counts, coverage, round_to);
        double total = 0;
        for (auto c : counts) total += static_cast<double>(c);
        std::vector<int64_t> bounds{0};
        bounds.insert(bounds.end(), cutoffs.begin(), cutoffs.end());
        bounds.push_back(static_cast<int64_t>(counts.size()));
        for (size_t i = 0; i + 1 < bounds.size(); ++i) {
          double share = 0;
          for (int64_t k = bounds[i]; k < bounds[i + 1]; ++k) share += static_cast<double>(counts[k]);
          fmt::print("cluster {}: ids [{}, {}) {} words, {:.2f}% of training tokens\n", i, bounds[i], bounds[i + 1],
                     bounds[i + 1] - bounds[i], 100 * share / total);
        }
        fmt::print("cutoffs [{}]  (model.adaptive = true, model.cutoffs = [{}])\n", fmt::join(cutoffs, ", "),
                   fmt::join(cutoffs, ", "));
      };
    });
  }
}

}  // namespace spanformer::cli
