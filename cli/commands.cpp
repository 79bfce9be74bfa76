#include "commands.h"
#include "xl_commands.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <unistd.h>

#include <cmath>
#include <random>
#include <thread>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/config/config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/data/download.h"
#include "spanformer/dist/group.h"
#include "spanformer/io/reference_import.h"
#include "spanformer/models/generate.h"
#include "spanformer/models/transformer_seq.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/evaluate.h"
#include "spanformer/train/trainer.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/viz/span_plot.h"

namespace spanformer::cli {
namespace {

// The config file plus `--key=value` overrides left over by CLI11.
Config resolve_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config config = path.empty() ? Config{} : load_config(path);
  apply_overrides(config, overrides);
  return config;
}

std::string checkpoint_file(const std::string& path) {
  // A run directory stands for its checkpoint.
  if (!file_exists(path) && file_exists(path + "/checkpoint.pt")) return path + "/checkpoint.pt";
  return path;
}

void print_spans(const models::TransformerSeq& model) {
  const auto spans = model->spans();
  for (size_t l = 0; l < spans.size(); ++l) {
    double sum = 0;
    for (double z : spans[l]) sum += z;
    fmt::print("layer {:>2}: mean {:7.1f} | heads {:.1f}\n", l, sum / static_cast<double>(spans[l].size()),
               fmt::join(spans[l], " "));
  }
}

// Spans as adaptive-span models learn them: most heads short, a few long (fixed seed).
void set_bimodal_spans(models::TransformerSeq& model) {
  if (!model->config().adapt_span) fail("--span-dist needs adapt_span");
  const double L = static_cast<double>(model->config().attn_span);
  std::mt19937 rng(1);
  torch::NoGradGuard no_grad;
  for (auto& layer : model->layers) {
    auto& r = layer->attn->span->span_ratio;
    for (int64_t h = 0; h < r.size(0); ++h) {
      const double z = h % 4 == 3 ? std::uniform_real_distribution<double>(std::min(2048.0, L), L)(rng)
                                  : std::uniform_real_distribution<double>(16.0, std::min(256.0, L))(rng);
      r[h] = z / L;
    }
  }
  model->sync_spans();
}

// The learned spans of a checkpoint's model (same layers and heads), for benchmarking at them.
void copy_spans(models::TransformerSeq& model, const std::string& path) {
  train::CheckpointReader reader(path);
  auto source = reader.load_model();
  if (source->layers.size() != model->layers.size() || source->config().nb_heads != model->config().nb_heads)
    fail("--spans-from {}: {} layers x {} heads, the benchmark model has {} x {}", path, source->layers.size(),
         source->config().nb_heads, model->layers.size(), model->config().nb_heads);
  if (!model->config().adapt_span || !source->config().adapt_span) fail("--spans-from needs adapt_span on both models");
  torch::NoGradGuard no_grad;
  const double scale = static_cast<double>(source->config().attn_span) / static_cast<double>(model->config().attn_span);
  for (size_t l = 0; l < model->layers.size(); ++l)
    model->layers[l]->attn->span->span_ratio.copy_((source->layers[l]->attn->span->span_ratio * scale).clamp(0.0, 1.0));
  model->sync_spans();
}

// With --nproc-per-node N > 1 outside a launched job: start N workers with the same arguments (minus
// the flag), wait for them and return true (exiting with their failure status if any).
bool launch_workers(int nproc, const std::vector<std::string>& program_args) {
  if (nproc < 1) fail("--nproc-per-node must be at least 1 (got {})", nproc);
  if (nproc == 1 || std::getenv("RANK")) return false;
  std::vector<std::string> args;
  for (size_t i = 0; i < program_args.size(); ++i) {
    if (program_args[i] == "--nproc-per-node") {
      ++i;
      continue;
    }
    if (program_args[i].rfind("--nproc-per-node=", 0) == 0) continue;
    args.push_back(program_args[i]);
  }
  const int status = dist::spawn_local_workers(nproc, args);
  if (status != 0) std::exit(status);
  return true;
}

}  // namespace

void add_commands(CLI::App& app, std::function<void()>& run, int argc, char** argv) {
  static std::vector<std::string> program_args(argv, argv + argc);
  static int threads = 0;
  static std::string device = "cpu";
  app.add_option("--threads", threads, "CPU threads for LibTorch (default: all cores)");
  app.add_option("--device", device, "cpu | cuda | cuda:N (eval, generate, bench; train uses train.device)");
  static std::string attn_impl;
  app.add_option("--attn-impl", attn_impl, "auto | fused | plain: how attention is computed (eval, generate; default: the checkpoint's)");

  // ---- train -------------------------------------------------------------------------------------
  {
    static std::string config_path, data_dir, out_dir = "runs/default", init;
    static bool resume = false, quiet = false;
    static int64_t stop_after = -1;
    static int nproc = 1;
    auto* cmd = app.add_subcommand("train", "train a model (config file + --key=value overrides)");
    cmd->add_option("--nproc-per-node", nproc, "data-parallel: start N local worker processes (Gloo on loopback); "
                                               "multi-node jobs use torchrun/SLURM variables instead");
    cmd->add_option("--config,-c", config_path, "JSON config (configs/*.json)")->required();
    cmd->add_option("--data", data_dir, "prepared data directory (overrides train.data)");
    cmd->add_option("--out,-o", out_dir, "run directory: config.json, log.jsonl, checkpoint.pt")->capture_default_str();
    cmd->add_flag("--resume", resume, "continue from OUT/checkpoint.pt (exactly where it stopped)");
    cmd->add_option("--init", init, "start a new run from the weights of this checkpoint (e.g. an imported model)");
    cmd->add_option("--stop-after", stop_after, "stop with a checkpoint after this many steps of this session");
    cmd->add_flag("--quiet", quiet, "no progress lines");
    cmd->allow_extras();
    cmd->callback([cmd, &run] {
      auto overrides = cmd->remaining();
      run = [overrides] {
        if (xl::is_xl_config(config_path)) {
          if (nproc != 1) fail("--nproc-per-node: Transformer-XL/PAR training runs in one process for now");
          xl::train({config_path, data_dir, out_dir, overrides, resume, quiet, stop_after, threads});
          return;
        }
        if (launch_workers(nproc, program_args)) return;
        Config config = resolve_config(config_path, overrides);
        if (!data_dir.empty()) config.train.data = data_dir;
        if (threads > 0) config.train.threads = threads;
        validate(config);
        dist::GroupOptions group_options;
        group_options.timeout_seconds = config.train.dist_timeout;
        group_options.backend = config.train.dist_backend;
        group_options.cuda = config.train.device.rfind("cuda", 0) == 0;
        auto group = dist::Group::from_env(group_options);
        if (group && config.train.threads == 0 && std::getenv("LOCAL_WORLD_SIZE")) {
          // Share the cores among the local workers.
          const int local_world = std::max(1, std::atoi(std::getenv("LOCAL_WORLD_SIZE")));
          config.train.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_world);
        }
        if (!group || group->is_main()) fmt::print("spanformer: config {}\n", to_json(config).dump());
        train::RunOptions options;
        options.out_dir = out_dir;
        options.resume = resume;
        options.progress = !quiet;
        options.stop_after = stop_after;
        options.init_from = init;
        options.group = group;
        auto result = train::run_training(config, options);
        if ((!group || group->is_main()) && result.session_steps == 0)
          fmt::print("{}/checkpoint.pt is already at step {}: nothing to train (raise nb_steps to continue)\n", out_dir,
                     result.steps);
        else if (!group || group->is_main())
          fmt::print("trained {} steps: train {:.4f} bpc, valid {:.4f} bpc; checkpoint {}/checkpoint.pt\n", result.steps,
                     result.last_train_bpc, result.last_valid_bpc, out_dir);
        if (result.interrupted) std::exit(130);
      };
    });
  }

  // ---- eval --------------------------------------------------------------------------------------
  {
    static std::string checkpoint, data_dir, split = "test", unit = "bpc", ids, vocab_path;
    static bool unit_given = false;
    static int64_t batch = -1;
    static int eval_nproc = 1;
    auto* cmd = app.add_subcommand("eval", "full evaluation of a checkpoint (the reference's protocol)");
    cmd->add_option("checkpoint", checkpoint, "checkpoint file or run directory")->required();
    cmd->add_option("--data", data_dir, "prepared data directory (default: the one the model was trained on)");
    cmd->add_option("--split", split, "train | valid | test")->capture_default_str();
    cmd->add_option("--batch", batch, "evaluation streams (default: the config's eval_batch_size, 8)");
    cmd->add_option("--unit", unit, "bpc (characters) or ppl (words); Transformer-XL/PAR: the data's unit by default")
        ->capture_default_str()
        ->each([](const std::string&) { unit_given = true; });
    cmd->add_option("--ids", ids, "evaluate a headerless file of one-byte token ids of the checkpoint's vocabulary "
                                  "(e.g. the reference's valid.ids.u8) instead of a data split");
    cmd->add_option("--vocab", vocab_path, "vocab.txt the ids were made with; must be the checkpoint's vocabulary");
    cmd->add_option("--nproc-per-node", eval_nproc, "split the streams over N local processes (or use torchrun/SLURM variables)");
    cmd->allow_extras();  // Transformer-XL/PAR: --eval_mem_len=1600 etc.
    cmd->callback([cmd, &run] {
      auto overrides = cmd->remaining();
      run = [overrides] {
        if (xl::is_xl_checkpoint(checkpoint)) {
          if (eval_nproc != 1) fail("--nproc-per-node: Transformer-XL/PAR evaluation runs in one process for now");
          xl::EvalArgs args;
          args.checkpoint = checkpoint;
          args.data_dir = data_dir;
          args.split = split;
          args.unit = unit_given ? unit : "";
          args.overrides = overrides;
          args.batch = batch;
          args.threads = threads;
          args.device = device;
          xl::eval(args);
          return;
        }
        if (!overrides.empty()) fail("unexpected arguments for an adaptive-span checkpoint: {}", fmt::join(overrides, " "));
        if (unit != "bpc" && unit != "ppl") fail("--unit must be bpc or ppl (got '{}')", unit);
        if (launch_workers(eval_nproc, program_args)) return;
        auto group = dist::Group::from_env(dist::GroupOptions{});
        if (batch == 0 || batch < -1) fail("--batch must be positive (got {})", batch);
        set_threads(threads);
        const bool tty = isatty(STDERR_FILENO);
        train::CheckpointReader reader(checkpoint_file(checkpoint));
        if (batch < 0) batch = reader.config().train.eval_batch_size;
        if (!vocab_path.empty() &&
            data::vocab_to_text(data::read_vocab(vocab_path)) != data::vocab_to_text(reader.vocab()))
          fail("{} is not the vocabulary of {}: the ids would mean other characters", vocab_path, checkpoint);
        std::unique_ptr<data::TokenFile> raw;
        data::Corpus corpus;
        if (!ids.empty()) {
          raw = std::make_unique<data::TokenFile>(ids, data::TokenFile::RawBytes{}, reader.vocab().size());
        } else {
          const std::string dir = data_dir.empty() ? reader.config().train.data : data_dir;
          corpus = data::load_corpus(dir, split);
          if (data::vocab_to_text(corpus.vocab) != data::vocab_to_text(reader.vocab()))
            fail("{}/vocab.txt differs from the checkpoint's vocabulary: the model was trained on other data", dir);
        }
        const data::TokenFile& tokens = raw ? *raw : corpus.split(split);
        const std::string label = raw ? ids : split;
        auto model = reader.load_model(attn_impl);
        model->to(train::parse_device(device));
        const double start = now_seconds();
        auto result = train::evaluate(model, tokens, batch, [&](int64_t done, int64_t total) {
          if (tty && done % 20 == 0) fmt::print(stderr, "\r  eval block {}/{}", done, total);
        }, group.get());
        if (group && !group->is_main()) return;
        if (tty) fmt::print(stderr, "\r{:40}\r", "");
        const double value = unit == "bpc" ? result.bpc() : result.ppl();
        fmt::print("{} {} {:.7f} ({} blocks, {} tokens, {:.1f} s)\n", label, unit, value, result.blocks, result.tokens,
                   now_seconds() - start);
      };
    });
  }

  // ---- generate ----------------------------------------------------------------------------------
  {
    static std::string checkpoint, prompt = "\n";
    static models::GenerateOptions options;
    static uint64_t seed = 1;
    auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint");
    cmd->add_option("checkpoint", checkpoint, "checkpoint file or run directory")->required();
    cmd->add_option("--prompt,-p", prompt, "text to continue");
    cmd->add_option("--tokens,-n", options.tokens, "characters to generate")->capture_default_str();
    cmd->add_option("--temperature,-t", options.temperature, "sampling temperature")->capture_default_str();
    cmd->add_option("--top-k,-k", options.top_k, "sample among the k most likely (0 = all)")->capture_default_str();
    cmd->add_option("--seed", seed, "random seed")->capture_default_str();
    cmd->callback([&run] {
      run = [] {
        set_threads(threads);
        torch::manual_seed(seed);
        train::CheckpointReader reader(checkpoint_file(checkpoint));
        auto model = reader.load_model(attn_impl);
        model->to(train::parse_device(device));
        std::cout << prompt << std::flush;
        models::generate(model, reader.vocab(), prompt, options,
                         [](const std::string& piece) { std::cout << piece << std::flush; });
        std::cout << std::endl;
      };
    });
  }

  // ---- spans -------------------------------------------------------------------------------------
  {
    static std::string checkpoint, out = "spans.png";
    auto* cmd = app.add_subcommand("spans", "print per-layer, per-head spans and draw them");
    cmd->add_option("checkpoint", checkpoint, "checkpoint file or run directory")->required();
    cmd->add_option("--out,-o", out, "PNG to write")->capture_default_str();
    cmd->callback([&run] {
      run = [] {
        train::CheckpointReader reader(checkpoint_file(checkpoint));
        auto model = reader.load_model(attn_impl);
        print_spans(model);
        viz::SpanPlotOptions options;
        options.attn_span = model->config().attn_span;
        options.ramp = model->config().adapt_span_ramp;
        options.title = fmt::format("Learned spans: {}", checkpoint);
        viz::write_span_plot(out, model->spans(), options);
        fmt::print("span picture: {}\n", out);
      };
    });
  }

  // ---- data --------------------------------------------------------------------------------------
  {
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
    xl::add_data_commands(data_cmd, run);
  }
  xl::add_par_commands(app, run);

  // ---- import / export (the Python reference's checkpoints) -------------------------------------
  {
    static std::string kind, input, config_path, vocab_path, out;
    auto* cmd = app.add_subcommand("import", "convert a reference checkpoint into a spanformer checkpoint");
    cmd->add_option("kind", kind, "adaptive-span")->required()->check(CLI::IsMember({"adaptive-span"}));
    cmd->add_option("model", input, "state_dict extracted from the reference's checkpoint (see README)")->required();
    cmd->add_option("--config,-c", config_path, "spanformer config describing the model")->required();
    cmd->add_option("--vocab", vocab_path, "the reference's vocabulary (vocab.txt: a byte value or <eos> per line)")->required();
    cmd->add_option("--out,-o", out, "spanformer checkpoint to write")->required();
    cmd->allow_extras();
    cmd->callback([cmd, &run] {
      auto overrides = cmd->remaining();
      run = [overrides] {
        Config config = resolve_config(config_path, overrides);
        auto vocab = data::read_vocab(vocab_path);
        if (config.model.vocab_size == 0) config.model.vocab_size = vocab.size();
        if (config.model.vocab_size != vocab.size())
          fail("config vocab_size {} does not match {} ({} tokens)", config.model.vocab_size, vocab_path, vocab.size());
        validate(config.model);
        models::TransformerSeq model(config.model);
        io::load_reference_state_dict(model, input);
        train::save_checkpoint(out, config, vocab, model, nullptr, nullptr);
        fmt::print("imported {} -> {}\n", input, out);
        print_spans(model);
      };
    });
    static std::string exp_kind, exp_checkpoint, exp_out;
    auto* exp = app.add_subcommand("export", "write a checkpoint as a state_dict the Python reference loads");
    exp->add_option("kind", exp_kind, "adaptive-span")->required()->check(CLI::IsMember({"adaptive-span"}));
    exp->add_option("checkpoint", exp_checkpoint, "checkpoint file or run directory")->required();
    exp->add_option("--out,-o", exp_out, "state_dict file to write (torch.save format)")->required();
    exp->callback([&run] {
      run = [] {
        train::CheckpointReader reader(checkpoint_file(exp_checkpoint));
        auto model = reader.load_model(attn_impl);
        io::save_reference_state_dict(model, exp_out);
        fmt::print("exported {} -> {} (load in Python with model.load_state_dict(torch.load(path)))\n", exp_checkpoint,
                   exp_out);
      };
    });
  }

  // ---- bench -------------------------------------------------------------------------------------
  {
    static std::string config_path;
    static int64_t steps = 5, warmup = 2;
    static double span = -1;
    static std::string span_dist, mode = "train";
    static int64_t mem_len = -1, tgt_len = 0;
    auto* cmd = app.add_subcommand("bench", "training-step speed and memory on random tokens");
    cmd->add_option("--mode", mode, "train (step time) or eval (forward only, no gradients; Transformer-XL/PAR: "
                                    "time per token with a full memory)")
        ->capture_default_str()
        ->check(CLI::IsMember({"train", "eval"}));
    static std::string spans_from;
    cmd->add_option("--spans-from", spans_from, "take every head's span from this checkpoint (same layers and heads), "
                                                "e.g. an imported reference model's learned spans");
    cmd->add_option("--mem-len", mem_len, "Transformer-XL/PAR eval mode: memory length (default: the config's eval_mem_len)");
    cmd->add_option("--tgt-len", tgt_len, "Transformer-XL/PAR eval mode: segment length (default: the config's eval_tgt_len)");
    cmd->add_option("--config,-c", config_path, "JSON config")->required();
    cmd->add_option("--steps", steps, "timed steps")->capture_default_str();
    cmd->add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
    cmd->add_option("--span", span, "set every head's span z to this many tokens (default: the config's init)");
    cmd->add_option("--span-dist", span_dist,
                    "bimodal: per layer, 3 of 4 heads in [16, 256] and 1 of 4 in [2048, L] (fixed seed), as learned spans look")
        ->check(CLI::IsMember({"bimodal"}));
    cmd->allow_extras();
    cmd->callback([cmd, &run] {
      auto overrides = cmd->remaining();
      run = [overrides] {
        if (xl::is_xl_config(config_path)) {
          xl::BenchArgs args;
          args.config_path = config_path;
          args.mode = mode;
          args.overrides = overrides;
          args.steps = steps;
          args.warmup = warmup;
          args.mem_len = mem_len;
          args.tgt_len = tgt_len;
          args.threads = threads;
          args.device = device;
          xl::bench(args);
          return;
        }
        Config config = resolve_config(config_path, overrides);
        if (config.model.vocab_size == 0) config.model.vocab_size = 256;
        if (span >= 0) config.model.adapt_span_init = std::min(1.0, span / static_cast<double>(config.model.attn_span));
        if (threads > 0) config.train.threads = threads;
        validate(config);
        const int used_threads = set_threads(static_cast<int>(config.train.threads));
        torch::manual_seed(config.train.seed);
        const torch::Device dev = train::parse_device(device);
        models::TransformerSeq model(config.model);
        if (span_dist == "bimodal") set_bimodal_spans(model);
        if (!spans_from.empty()) copy_spans(model, checkpoint_file(spans_from));
        model->to(dev);
        std::vector<std::pair<std::string, torch::Tensor>> params;
        for (auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
        train::Optimizer optimizer(params, train::optimizer_options(config.train));
        const int64_t B = config.train.batch_size, M = config.model.block_size;
        auto caches = model->initial_caches(B);
        const bool eval_mode = mode == "eval";
        if (eval_mode) model->eval();
        double total = 0;
        for (int64_t i = 0; i < warmup + steps; ++i) {
          auto x = torch::randint(config.model.vocab_size, {B, M}, torch::kLong).to(dev);
          auto y = torch::randint(config.model.vocab_size, {B, M}, torch::kLong).to(dev);
          const double t0 = now_seconds();
          if (eval_mode) {
            torch::NoGradGuard no_grad;
            train::eval_block(model, x, y, caches).item<double>();
          } else {
            train::train_step(model, optimizer, x, y, caches, config.train.batch_split, 1e-9).item<double>();
          }
          const double dt = now_seconds() - t0;
          if (i >= warmup) total += dt;
          fmt::print(stderr, "  step {}/{}: {:.0f} ms{}\n", i + 1, warmup + steps, dt * 1e3, i < warmup ? " (warmup)" : "");
        }
        const double per_step = total / static_cast<double>(steps);
        double mean_span = 0;
        int64_t used = 0;
        for (auto& l : model->layers) used += l->attn->used_span();
        for (auto& z : model->spans())
          for (double v : z) mean_span += v / static_cast<double>(z.size() * model->layers.size());
        std::string fused_layers;
        for (auto& l : model->layers) fused_layers += l->attn->uses_fused_op(B, M) ? 'f' : 'p';
        fmt::print("bench: {} {}, {} layers, H {}, K {}, L {}, M {}, B {}, threads {}, attention {} (layers {}), "
                   "mean span {:.0f}, keys/layer {:.0f}\n",
                   mode, eval_mode ? "forward" : "step", config.model.nb_layers, config.model.hidden_size, config.model.nb_heads, config.model.attn_span, M, B,
                   used_threads, attention::attn_impl_name(config.model.attn_impl), fused_layers, mean_span,
                   static_cast<double>(used) / static_cast<double>(model->layers.size()));
        fmt::print("bench: {:.1f} ms/step, {:.0f} tokens/s, peak RSS {:.0f} MB\n", per_step * 1e3,
                   static_cast<double>(B * M) / per_step, peak_rss_bytes() / 1e6);
      };
    });
  }
}

}  // namespace spanformer::cli
