#include "xl_commands.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <unistd.h>

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/config/xl_config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/data/words.h"
#include "spanformer/models/par.h"
#include "spanformer/models/xl.h"
#include "spanformer/nn/adaptive_softmax.h"
#include "spanformer/train/evaluate.h"
#include "spanformer/train/trainer.h"
#include "spanformer/train/xl_trainer.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/viz/search_plot.h"

namespace spanformer::cli::xl {
namespace {

std::string checkpoint_file(const std::string& path) {
  if (!file_exists(path) && file_exists(path + "/checkpoint.pt")) return path + "/checkpoint.pt";
  return path;
}

// Token ids with Zipf-like frequencies (P(id) ~ 1 / (id + 1), ids in frequency order as in a prepared
// vocabulary): the adaptive softmax then sees clusters as often as on real text.
torch::Tensor zipf_tokens(int64_t V, at::IntArrayRef sizes, torch::Device device) {
  auto u = torch::rand(sizes, torch::kDouble);
  return (torch::exp(u * std::log(static_cast<double>(V))) - 1).floor().clamp(0, V - 1).to(torch::kLong).to(device);
}

void refuse_multi_process() {
  if (std::getenv("RANK") && std::getenv("WORLD_SIZE") && std::string(std::getenv("WORLD_SIZE")) != "1")
    fail("Transformer-XL/PAR training runs in one process for now (data-parallel runs are adaptive-span only)");
}

}  // namespace

bool is_xl_config(const std::string& path) { return config_arch(path) == "xl"; }

bool is_xl_checkpoint(const std::string& path) {
  return train::xl::checkpoint_format(checkpoint_file(path)) == train::xl::kXlCheckpointFormat;
}

void train(const TrainArgs& a) {
  refuse_multi_process();
  XlConfig config = load_xl_config(a.config_path);
  apply_overrides(config, a.overrides);
  if (!a.data_dir.empty()) config.train.data = a.data_dir;
  if (a.threads > 0) config.train.threads = a.threads;
  validate(config);
  fmt::print("spanformer: config {}\n", to_json(config).dump());
  train::xl::RunOptions options;
  options.out_dir = a.out_dir;
  options.resume = a.resume;
  options.progress = !a.quiet;
  options.stop_after = a.stop_after;
  auto result = train::xl::run_training(config, options);
  if (result.session_steps == 0)
    fmt::print("{}/checkpoint.pt is already at step {}: nothing to train (raise nb_steps to continue)\n", a.out_dir,
               result.steps);
  else
    fmt::print("trained {} steps: train {:.4f} {}, valid {:.4f} {}; checkpoint {}/checkpoint.pt\n", result.steps,
               result.last_train, result.unit, result.last_valid, result.unit, a.out_dir);
  if (result.interrupted) std::exit(130);
}

void eval(const EvalArgs& a) {
  set_threads(a.threads);
  train::xl::CheckpointReader reader(checkpoint_file(a.checkpoint));
  XlConfig config = reader.config();
  for (const auto& o : a.overrides) {
    auto key = o.substr(o.rfind('-', 1) == 1 ? 2 : 0);
    if (key.rfind("eval_", 0) != 0 && key.rfind("train.eval_", 0) != 0 && key.rfind("model.search_eval", 0) != 0 &&
        key.rfind("search_eval", 0) != 0)
      fail("eval accepts overrides of the evaluation protocol only (eval_tgt_len, eval_mem_len, eval_clamp_len, "
           "eval_same_length, search_eval), not '{}'", o);
  }
  apply_overrides(config, a.overrides);
  validate(config);
  if (a.batch == 0 || a.batch < -1) fail("--batch must be positive (got {})", a.batch);
  if (a.batch > 0) config.train.eval_batch_size = a.batch;
  const std::string dir = a.data_dir.empty() ? config.train.data : a.data_dir;
  data::Corpus corpus = data::load_corpus(dir, a.split);
  if (data::vocab_to_text(corpus.vocab) != data::vocab_to_text(reader.vocab()))
    fail("{}: its vocabulary differs from the checkpoint's: the model was trained on other data", dir);
  const std::string unit = a.unit.empty() ? (corpus.vocab.word_level ? "ppl" : "bpc") : a.unit;
  if (unit != "ppl" && unit != "bpc") fail("--unit must be bpc or ppl (got '{}')", unit);
  models::xl::XlModel model(config.model);  // with the overridden evaluation mode of a super-network
  reader.load_model_into(model);
  model->to(train::parse_device(a.device));
  auto options = train::xl::eval_options(config);
  const bool tty = isatty(STDERR_FILENO);
  const double start = now_seconds();
  auto r = train::xl::evaluate(model, corpus.split(a.split), options, [&](int64_t done, int64_t total) {
    if (tty && done % 10 == 0) fmt::print(stderr, "\r  eval segment {}/{}", done, total);
  });
  if (tty) fmt::print(stderr, "\r{:40}\r", "");
  fmt::print("{} {} {:.7f} (nll {:.6f} nats/token, {} tokens, {} segments; tgt_len {}, mem_len {}, clamp_len {}, "
             "same_length {}, batch {}; {:.1f} s)\n",
             a.split, unit, unit == "ppl" ? r.ppl() : r.bpc(), r.nll(), r.tokens, r.segments, options.tgt_len,
             options.lengths.mem_len, options.lengths.clamp_len, options.lengths.same_length, options.batch,
             now_seconds() - start);
}

void bench(const BenchArgs& a) {
  XlConfig config = load_xl_config(a.config_path);
  apply_overrides(config, a.overrides);
  if (config.model.vocab_size == 0) {  // random tokens: any vocabulary the cutoffs fit in
    config.model.vocab_size = config.model.adaptive && !config.model.cutoffs.empty()
                                  ? config.model.cutoffs.back() * 4 / 3 + 1
                                  : 10000;
    fmt::print(stderr, "bench: vocab_size {} (set --vocab_size to the data's)\n", config.model.vocab_size);
  }
  if (a.threads > 0) config.train.threads = a.threads;
  validate(config);
  if (a.steps < 1 || a.warmup < 0) fail("--steps must be >= 1 and --warmup >= 0");
  if (a.mode != "train" && a.mode != "eval") fail("--mode must be train or eval (got '{}')", a.mode);
  const int used_threads = set_threads(static_cast<int>(config.train.threads));
  torch::manual_seed(config.train.seed);
  const torch::Device dev = train::parse_device(a.device);
  models::xl::XlModel model(config.model);
  model->to(dev);
  const int64_t V = config.model.vocab_size;
  int64_t params = 0;
  for (auto& p : model->weight_parameters()) params += p.second.numel();
  if (a.mode == "train") {
    const int64_t B = config.train.batch_size, M = config.model.tgt_len;
    train::Optimizer optimizer(model->weight_parameters(), train::OptimizerOptions{config.train.optim, 0, config.train.grad_clip});
    std::unique_ptr<train::Optimizer> arch;
    if (config.model.search) arch = std::make_unique<train::Optimizer>(model->arch_parameters(), train::OptimizerOptions{OptimKind::kAdam});
    auto mems = model->initial_mems(B);
    double total = 0;
    for (int64_t i = 0; i < a.warmup + a.steps; ++i) {
      auto x = zipf_tokens(V, {B, M}, dev), y = zipf_tokens(V, {B, M}, dev);
      const double t0 = now_seconds();
      train::xl::train_step(model, optimizer, arch.get(), x, y, M, mems, config.train.batch_split, 1e-9, 1e-9, 1.0);
      const double dt = now_seconds() - t0;
      if (i >= a.warmup) total += dt;
      fmt::print(stderr, "  step {}/{}: {:.0f} ms{}\n", i + 1, a.warmup + a.steps, dt * 1e3, i < a.warmup ? " (warmup)" : "");
    }
    const double per_step = total / static_cast<double>(a.steps);
    fmt::print("bench xl train: blocks {} ({}), H {}, K {}x{}, I {}, M {}, mem {}, B {}, V {}, {:.1f}M weights, threads {}\n",
               model->blocks().size(), config.model.search ? "super-network" : model->blocks(), config.model.d_model,
               config.model.n_head, config.model.d_head, config.model.d_inner, M, config.model.mem_len, B, V,
               static_cast<double>(params) / 1e6, used_threads);
    fmt::print("bench xl train: {:.1f} ms/step, {:.0f} tokens/s, peak RSS {:.0f} MB\n", per_step * 1e3,
               static_cast<double>(B * M) / per_step, peak_rss_bytes() / 1e6);
    return;
  }
  // Evaluation speed with a full memory: the protocol's tgt_len and mem_len (or the flags').
  auto options = train::xl::eval_options(config);
  if (a.mem_len >= 0) options.lengths.mem_len = a.mem_len;
  if (a.tgt_len > 0) options.tgt_len = a.tgt_len;
  const int64_t B = options.batch, M = options.tgt_len;
  torch::NoGradGuard no_grad;
  model->eval();
  auto mems = model->initial_mems(B);
  auto weights = config.model.search ? model->eval_weights() : torch::Tensor();
  // A full memory (random states: the cost does not depend on their values), then timed segments.
  for (size_t b = 0; b < mems.size(); ++b)
    if (model->blocks()[b] != 'f')
      mems[b] = torch::randn({B, options.lengths.mem_len, config.model.d_model}, torch::TensorOptions().device(dev));
  double total = 0;
  for (int64_t i = 0; i < a.warmup + a.steps; ++i) {
    auto x = zipf_tokens(V, {B, M}, dev), y = zipf_tokens(V, {B, M}, dev);
    const double t0 = now_seconds();
    auto h = model->forward(x, mems, options.lengths, weights);
    model->nll(h, y).sum().item<double>();
    const double dt = now_seconds() - t0;
    if (i >= a.warmup) total += dt;
    fmt::print(stderr, "  segment {}/{}: {:.0f} ms{}\n", i + 1, a.warmup + a.steps, dt * 1e3, i < a.warmup ? " (warmup)" : "");
  }
  const double per_segment = total / static_cast<double>(a.steps);
  fmt::print("bench xl eval: blocks {} ({}), H {}, K {}x{}, I {}, tgt_len {}, mem_len {}, B {}, V {}, threads {}\n",
             model->blocks().size(), config.model.search ? "super-network" : model->blocks(), config.model.d_model,
             config.model.n_head, config.model.d_head, config.model.d_inner, M, options.lengths.mem_len, B, V, used_threads);
  fmt::print("bench xl eval: {:.1f} ms/segment, {:.4f} ms/token, {:.0f} tokens/s, peak RSS {:.0f} MB\n",
             per_segment * 1e3, per_segment * 1e3 / static_cast<double>(B * M), static_cast<double>(B * M) / per_segment,
             peak_rss_bytes() / 1e6);
}

void add_par_commands(CLI::App& app, std::function<void()>& run) {
  auto* par = app.add_subcommand("par", "PAR architecture search: derive a plain model, draw the search");
  par->require_subcommand(1);
  {
    static std::string checkpoint, out, rule = "par";
    static double ratio = 5.0;
    auto* cmd = par->add_subcommand("derive", "write the plain model config a trained super-network chose");
    cmd->add_option("checkpoint", checkpoint, "super-network checkpoint or run directory")->required();
    cmd->add_option("--out,-o", out, "config to write (JSON)")->required();
    cmd->add_option("--rule", rule, "argmax (per block) or par (attention only in the lower two thirds, "
                                    "total:attention = ratio)")->capture_default_str();
    cmd->add_option("--ratio,-p", ratio, "total:attention block ratio of the par rule")->capture_default_str();
    cmd->callback([&run] {
      run = [] {
        if (rule != "argmax" && rule != "par") fail("--rule must be argmax or par (got '{}')", rule);
        train::xl::CheckpointReader reader(checkpoint_file(checkpoint));
        if (!reader.config().model.search) fail("{} is not a super-network (model.search is false)", checkpoint);
        auto model = reader.load_model();
        auto p = model->probs().to(torch::kDouble);
        models::par::BlockProbs probs;
        for (int64_t b = 0; b < p.size(0); ++b) probs.push_back({p[b][0].item<double>(), p[b][1].item<double>(), p[b][2].item<double>()});
        const std::string layers = rule == "argmax" ? models::par::derive_argmax(probs) : models::par::derive_par(probs, ratio);
        auto config = models::par::derived_config(reader.config(), layers);
        auto j = to_json(config);
        j["description"] = fmt::format("PAR model derived from {} by the {} rule{}", checkpoint, rule,
                                       rule == "par" ? fmt::format(" (ratio {})", ratio) : "");
        write_file_atomic(out, j.dump(2) + "\n");
        for (size_t b = 0; b < probs.size(); ++b)
          fmt::print("block {:>2}: P(attention) {:.3f}  P(feed-forward) {:.3f}  P(identity) {:.3f}\n", b, probs[b][0],
                     probs[b][1], probs[b][2]);
        size_t attn = std::count(layers.begin(), layers.end(), 'a');
        fmt::print("derived layers \"{}\" ({} blocks, {} attention) -> {}\n", layers, layers.size(), attn, out);
      };
    });
  }
  {
    static std::string run_dir, out = "search.png";
    auto* cmd = par->add_subcommand("plot", "draw P(block type) per block against step, and the final choice");
    cmd->add_option("run", run_dir, "run directory of a super-network (its log.jsonl)")->required();
    cmd->add_option("--out,-o", out, "PNG to write")->capture_default_str();
    cmd->callback([&run] {
      run = [] {
        const std::string log = file_exists(run_dir + "/log.jsonl") ? run_dir + "/log.jsonl" : run_dir;
        auto history = viz::read_search_history(log);
        viz::write_search_plot(out, history, fmt::format("PAR search: {}", run_dir));
        fmt::print("search picture: {} ({} records, {} blocks)\n", out, history.steps.size(), history.probs[0].size());
      };
    });
  }
}

void add_data_commands(CLI::App* data, std::function<void()>& run) {
  {
    static data::WordPrepareOptions options;
    static std::string dir, out;
    auto* cmd = data->add_subcommand("words", "word-level preparation of WikiText-style files (<eos> per line)");
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
    auto* cmd = data->add_subcommand("cutoffs", "propose adaptive-softmax cutoffs from a word-level directory's counts");
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

}  // namespace spanformer::cli::xl
