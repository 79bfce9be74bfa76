#include "spanformer/train/runner.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/dist/group.h"
#include "spanformer/dist/reducer.h"
#include "spanformer/train/evaluate.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/version.h"

namespace spanformer::train {
namespace {

// Training state the Runner owns; the family's recurrent state is saved beside it.
struct RunState {
  int64_t step = 0, train_pos = 0, valid_pos = 0;
  double elapsed_seconds = 0;
  double best_valid = std::numeric_limits<double>::infinity();
};

// nats -> the run's unit: ppl (word vocabularies), bpc (byte ones) or nats (example data).
double in_unit(double nll, const std::string& unit) {
  return unit == "ppl" ? std::exp(nll) : unit == "bpc" ? nll / std::log(2.0) : nll;
}

}  // namespace

RunResult run_training(Family& family, const RunOptions& options) {
  TrainConfig& tc = family.train();
  if (tc.data.empty()) fail("no data: set train.data in the config or pass --data DIR");
  const bool examples = family.data_restart() == DataRestart::kExamples;  // the family reads its own data
  data::Corpus corpus;
  ExampleData example_data;
  if (examples) {
    example_data = family.open_examples(tc.data);
  } else {
    corpus = data::load_corpus(tc.data);
    family.set_vocab_size(corpus.vocab.size(), tc.data + "/vocab.txt");
    example_data.vocab = corpus.vocab;
    example_data.train_size = corpus.train->size();
    example_data.valid_size = corpus.valid->size();
    example_data.train_fingerprint = corpus.train->fingerprint();
    example_data.valid_fingerprint = corpus.valid->fingerprint();
    example_data.item = "tokens";
  }
  const data::Vocab& vocab = example_data.vocab;
  family.validate();
  set_threads(static_cast<int>(tc.threads));
  dist::Group* group = options.group.get();
  const int64_t world = group ? group->world() : 1, rank = group ? group->rank() : 0;
  const bool main_rank = rank == 0;
  const std::string unit = examples ? "nats" : vocab.word_level ? "ppl" : "bpc";
  if (tc.batch_size % world != 0 || (tc.batch_size / world) % tc.batch_split != 0)
    fail("batch_size {} must divide by the number of processes ({}) times batch_split ({})", tc.batch_size, world,
         tc.batch_split);
  if (group) {
    // Same model, optimisation and code on every rank (paths and thread counts may differ).
    auto shared = family.config_json();
    shared["train"].erase("data");
    shared["train"].erase("threads");
    group->check_same_as_main("config", shared.dump());
    group->check_same_as_main("code version", std::string(kVersion) + " torch " + compat::torch_version());
  }
  if (options.out_dir.empty()) fail("no run directory: --out must name a directory");
  const std::string checkpoint_path = options.out_dir + "/checkpoint.pt";
  const std::string best_path = options.out_dir + "/best.pt";
  const std::string log_path = options.out_dir + "/log.jsonl";
  const std::string sessions_path = options.out_dir + "/sessions.jsonl";  // one record per session: code, host, command
  make_dirs(options.out_dir);
  std::unique_ptr<DirectoryLock> lock;  // the main rank owns the run directory
  if (main_rank) {
    lock = std::make_unique<DirectoryLock>(options.out_dir, "training run");
    remove_stale_temporaries(options.out_dir);
    // A directory where a run file belongs would be taken for "no checkpoint" and removed (std::remove
    // deletes an empty directory) or fail at the first save: refused before anything runs.
    check_regular_or_absent(checkpoint_path, "the run's checkpoint");
    check_regular_or_absent(best_path, "the run's best checkpoint");
    check_regular_or_absent(log_path, "the run's log");
    check_regular_or_absent(sessions_path, "the run's session records");
    if (!options.resume && !options.overwrite && (file_exists(checkpoint_path) || file_exists(log_path)))
      fail("{} already holds a run: continue it with --resume, or replace it with --overwrite", options.out_dir);
  }

  // Messages for the user: stderr, and RUN/train.log with their UTC time (opened once a new run has
  // cleared the directory; what comes before waits in `early`).
  std::ofstream text_log;
  std::vector<std::string> early;
  auto say = [&](const std::string& text) {
    if (!main_rank) return;
    fmt::print(stderr, "{}\n", text);
    const std::string line = fmt::format("[{}] {}", utc_timestamp(), text);
    if (text_log.is_open())
      text_log << line << std::endl;
    else
      early.push_back(line);
  };

  const torch::Device device = parse_device(tc.device);
  torch::manual_seed(tc.seed);
  family.build();
  family.module().to(device);
  family.make_optimizers();
  std::unique_ptr<dist::GradientReducer> reducer;
  if (options.group && tc.dist_bucket_kb > 0)
    reducer = std::make_unique<dist::GradientReducer>(options.group, family.module().parameters(), tc.dist_bucket_kb * 1024);
  if (group)
    say(fmt::format("spanformer: {} processes; gradients all-reduced in {}", world,
                    reducer ? fmt::format("{} bucket(s) during backward", reducer->nb_buckets()) : "one bucket after backward"));
  const int64_t B = tc.batch_size, M = family.block_length();
  const int64_t local = B / world, first = rank * local;  // this rank's streams [first, first + local)
  std::unique_ptr<data::Streams> train_streams, valid_streams;
  if (!examples) {
    train_streams = std::make_unique<data::Streams>(*corpus.train, B);
    valid_streams = std::make_unique<data::Streams>(*corpus.valid, B);
  }
  const bool contexts = family.data_restart() == DataRestart::kRandomContexts || examples;  // no streams to walk
  if (examples) {
    if (example_data.train_size < B) fail("{}: {} training examples, fewer than a batch of {}", tc.data, example_data.train_size, B);
  } else if (contexts) {
    if (corpus.train->size() <= M + 1) fail("{}/train.bin is too short for contexts of {} tokens", tc.data, M);
    if (corpus.valid->size() <= M + 1) fail("{}/valid.bin is too short for contexts of {} tokens", tc.data, M);
  } else {
    const int64_t min_length = family.data_restart() == DataRestart::kRandomOffset ? 2 * M : M + 1;
    if (train_streams->length() <= min_length) fail("{}/train.bin is too short for {} streams of blocks of {}", tc.data, B, M);
    if (valid_streams->length() <= min_length) fail("{}/valid.bin is too short for {} streams of blocks of {}", tc.data, B, M);
  }

  const std::pair<std::string, std::string> fingerprints{example_data.train_fingerprint, example_data.valid_fingerprint};
  // Stream lengths (0 for data without streams).
  const int64_t train_length = train_streams ? train_streams->length() : 0;
  const int64_t valid_length = valid_streams ? valid_streams->length() : 1;
  RunState state;
  if (options.resume && file_exists(checkpoint_path)) {
    Checkpoint ck(checkpoint_path);
    family.load_weights(ck);
    family.load_optimizers(ck);
    if (!ck.has_train_state()) fail("checkpoint {} has no training state; it cannot be resumed", checkpoint_path);
    if (!data::same_vocabulary(ck.vocab(), vocab))
      fail("checkpoint {} was trained with another vocabulary than {}", checkpoint_path, tc.data);
    if (ck.has("state.train_sha256") && (ck.text("state.train_sha256") != fingerprints.first ||
                                         ck.text("state.valid_sha256") != fingerprints.second))
      fail("checkpoint {} was trained on other data than {} (its train.bin / valid.bin fingerprints differ)",
           checkpoint_path, tc.data);
    if (ck.has("state.train_tokens") &&
        (ck.integer("state.train_tokens") != example_data.train_size || ck.integer("state.valid_tokens") != example_data.valid_size))
      fail("checkpoint {} was trained on data of {} train / {} valid {}; {} has {} / {}: not the same data",
           checkpoint_path, ck.integer("state.train_tokens"), ck.integer("state.valid_tokens"), example_data.item, tc.data,
           example_data.train_size, example_data.valid_size);
    state.step = ck.integer("state.step");
    state.train_pos = ck.integer("state.train_pos");
    if (ck.has("state.valid_pos")) state.valid_pos = ck.integer("state.valid_pos");
    state.elapsed_seconds = ck.number("state.elapsed_seconds");
    if (ck.has("state.best_valid")) state.best_valid = ck.number("state.best_valid");
    if (state.step < 0 || state.train_pos < 0 || (!contexts && state.train_pos + M >= train_length) || state.valid_pos < 0 ||
        state.valid_pos >= valid_length || !(state.elapsed_seconds >= 0))
      fail("checkpoint {} is damaged: its training position (step {}, train {}, valid {}) is outside the data",
           checkpoint_path, state.step, state.train_pos, state.valid_pos);
    family.load_state(ck, B, first, local);
    compat::set_generator_state(c10::DeviceType::CPU, ck.tensor("state.rng"));
    if (device.is_cuda() && ck.has("state.cuda_rng"))
      compat::set_generator_state(c10::DeviceType::CUDA, ck.tensor("state.cuda_rng"));
    say(fmt::format("spanformer: resumed {} at step {} ({} process{})", checkpoint_path, state.step, world,
                    world > 1 ? "es" : ""));
    // --resume --init: resume wins once a checkpoint exists (a job relaunched after preemption keeps its
    // progress); --init only seeds the run's first session.
    if (!options.init_from.empty())
      say(fmt::format("spanformer: --init {} is not used: it only starts a new run, and {} has a checkpoint",
                      options.init_from, options.out_dir));
  } else {
    if (options.resume) say(fmt::format("spanformer: no checkpoint in {}, starting a new run", options.out_dir));
    if (!options.init_from.empty()) {
      Checkpoint init(options.init_from);
      if (!data::same_vocabulary(init.vocab(), vocab))
        fail("{} was trained with another vocabulary than {}", options.init_from, tc.data);
      family.load_weights(init);
      say(fmt::format("spanformer: starting from the weights of {}", options.init_from));
    }
    family.init_state(local);
    if (main_rank) {  // a new run starts new logs and leaves no checkpoint of the run it replaces
      write_file_atomic(log_path, "");
      write_file_atomic(options.out_dir + "/train.log", "");
      std::remove(best_path.c_str());
      std::remove(checkpoint_path.c_str());
      std::remove(sessions_path.c_str());
    }
  }
  if (options.on_started) options.on_started();
  if (main_rank) {
    write_file_atomic(options.out_dir + "/config.json", family.config_json().dump(2) + "\n");
    auto record = build_record(options.command_line);
    record["step"] = state.step;
    record["processes"] = world;
    std::ofstream(sessions_path, std::ios::app) << record.dump() << "\n";
    text_log.open(options.out_dir + "/train.log", std::ios::app);
    text_log << fmt::format("[{}] session at step {}: {}", utc_timestamp(), state.step, fmt::join(options.command_line, " "))
             << std::endl;
    for (const auto& line : early) text_log << line << std::endl;
  }

  install_interrupt_handler();
  std::ofstream log;
  if (main_rank) log.open(log_path, std::ios::app);
  const bool tty = main_rank && options.progress && isatty(STDERR_FILENO);
  const int64_t first_step = state.step;
  const int64_t last_step = options.stop_after >= 0 ? std::min(tc.nb_steps, first_step + options.stop_after) : tc.nb_steps;
  const int64_t checkpoint_every = tc.checkpoint_interval > 0 ? tc.checkpoint_interval : tc.eval_interval;
  const double session_start = now_seconds();
  double last_progress_logged = session_start;

  auto save = [&](const std::string& path) {  // collective: every rank calls it at the same steps
    auto gather = [&](const torch::Tensor& t) { return group ? group->all_gather_cat(t.cpu()) : t.cpu(); };
    CheckpointWriter out(family.name(), family.config_json(), vocab);
    for (const auto& item : family.module().named_parameters()) out.put("model." + item.key(), item.value());
    family.save_optimizers(out);
    out.put_int("state.step", state.step);
    out.put_int("state.train_pos", state.train_pos);
    out.put_int("state.valid_pos", state.valid_pos);
    out.put_int("state.train_tokens", example_data.train_size);  // examples, for example data
    out.put_int("state.valid_tokens", example_data.valid_size);
    out.put_text("state.train_sha256", fingerprints.first);
    out.put_text("state.valid_sha256", fingerprints.second);
    out.put_double("state.elapsed_seconds", state.elapsed_seconds + (now_seconds() - session_start));
    out.put_double("state.best_valid", state.best_valid);
    out.put("state.rng", compat::generator_state(c10::DeviceType::CPU));
    if (device.is_cuda()) out.put("state.cuda_rng", compat::generator_state(c10::DeviceType::CUDA));
    family.save_state(out, gather);
    if (main_rank) out.save(path);
  };

  RunResult result;
  result.unit = unit;
  double interval_loss = 0, interval_start = now_seconds(), interval_collective = 0;
  int64_t epoch_drawn = -1;  // example data: the epoch whose order epoch_order holds
  torch::Tensor epoch_order;  // (train examples) int64
  const std::string speed_key = example_data.item + "_per_s";
  const char* speed_unit = examples ? "ex/s" : "tok/s";
  int64_t interval_steps = 0;
  while (state.step < last_step) {
    const bool stop = group ? group->all_reduce_sum(interrupted() ? 1.0 : 0.0) > 0 : interrupted();
    if (stop) {
      save(checkpoint_path);
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("spanformer: checkpoint saved at step {} in {}", state.step, checkpoint_path));
      result.interrupted = true;
      break;
    }
    StepContext ctx;
    ctx.step = state.step + 1;
    ctx.lr = learning_rate(tc, ctx.step);
    ctx.group = group;
    ctx.reducer = reducer.get();
    ctx.amp = tc.amp;
    ctx.device_type = device.type();
    torch::Tensor x, y;  // (b, e + M)
    if (examples) {
      // Batch j of epoch e (drop-last epochs): a permutation drawn from (seed, e) alone.
      const int64_t per_epoch = example_data.train_size / B, e = (ctx.step - 1) / per_epoch, j = (ctx.step - 1) % per_epoch;
      if (e != epoch_drawn) {
        auto generator = at::detail::createCPUGenerator(tc.seed * 1000003ULL + static_cast<uint64_t>(e));
        epoch_order = torch::randperm(example_data.train_size, generator, torch::kLong);
        family.arrange_epoch(epoch_order, B, generator);
        epoch_drawn = e;
      }
      const int64_t* order = epoch_order.data_ptr<int64_t>() + j * B + first;
      std::tie(x, y) = family.example_batch(std::vector<int64_t>(order, order + local), device);
    } else if (contexts) {
      auto draw = torch::randint(corpus.train->size() - M, {B}, torch::kLong);  // every rank draws all B
      std::vector<int64_t> starts(draw.data_ptr<int64_t>() + first, draw.data_ptr<int64_t>() + first + local);
      std::tie(x, y) = make_contexts(*corpus.train, starts, M, device);
    } else {
      const int64_t e = family.context(state.train_pos);
      std::tie(x, y) = make_block(*train_streams, state.train_pos - e, e + M, device, first, local);
    }
    auto loss = family.train_step(x, y, ctx);
    double loss_value = loss.item<double>();  // the one host read of the step
    if (group) loss_value = group->all_reduce_sum(loss_value) / static_cast<double>(world);
    if (!std::isfinite(loss_value))
      fail("training diverged at step {}: the loss is {} (lower lr or grad_clip; the last checkpoint is kept)", ctx.step,
           loss_value);
    state.step = ctx.step;
    interval_loss += loss_value;
    ++interval_steps;
    if (!contexts) state.train_pos += M;
    if (!contexts && state.train_pos + M > train_length - 1) {  // no full block left
      state.train_pos = family.data_restart() == DataRestart::kRandomOffset
                            ? torch::randint(M, {1}, torch::kLong).item<int64_t>()  // the reference's rule
                            : 0;
      family.reset_train_state();
    }

    const double elapsed = now_seconds() - session_start;
    const double per_step = elapsed / static_cast<double>(state.step - first_step);
    // The progress line: on a terminal after every step; in train.log at most every 30 s.
    const bool log_progress = text_log.is_open() && now_seconds() - last_progress_logged >= 30;
    if (tty || log_progress) {
      const std::string line = fmt::format(
          "step {}/{} | train {:.3f} {} | lr {:.2e} | {:.0f} ms/step | {:.0f} {} | left {}", state.step, tc.nb_steps,
          in_unit(loss_value, unit), unit, ctx.lr, per_step * 1e3, B * M / per_step, speed_unit,
          format_duration(per_step * static_cast<double>(last_step - state.step)));
      if (tty) fmt::print(stderr, "\r  {}   ", line);
      if (log_progress) {
        text_log << fmt::format("[{}]   {}", utc_timestamp(), line) << std::endl;
        last_progress_logged = now_seconds();
      }
    }

    // Validation only at interval ends and at the end of the run, never at a session stop: a stopped and
    // resumed run then reads exactly the same validation blocks as an uninterrupted one.
    if (state.step % tc.eval_interval == 0 || state.step == tc.nb_steps) {
      const double interval_seconds = now_seconds() - interval_start;
      double valid_nll = 0, valid_accuracy = -1;
      ExampleScore valid_score;
      if (examples) {
        auto score = family.score_examples("valid", rank, world);
        if (group) {
          score.nll_sum = group->all_reduce_sum(score.nll_sum);
          score.correct = group->all_reduce_sum(score.correct);
          score.count = group->all_reduce_sum(score.count);
          for (auto& v : score.sums) v = group->all_reduce_sum(v);
        }
        valid_nll = score.nll_sum / score.count;
        valid_accuracy = score.correct / score.count;
        valid_score = std::move(score);
      } else {
        valid_nll = family.validate(*corpus.valid, B, first, local, state.valid_pos);
        if (group) valid_nll = group->all_reduce_sum(valid_nll) / static_cast<double>(world);  // equal shares
      }
      const double train_nll = interval_loss / static_cast<double>(interval_steps);
      result.last_train = in_unit(train_nll, unit);
      result.last_valid = in_unit(valid_nll, unit);
      result.evaluated = true;
      result.last_accuracy = valid_accuracy;
      const double ms_per_step = interval_seconds * 1e3 / static_cast<double>(interval_steps);
      const bool best = valid_nll < state.best_valid;
      if (best) state.best_valid = valid_nll;
      nlohmann::json record = {
          {"step", state.step},
          {"train_loss", train_nll},
          {"valid_loss", valid_nll},
          {"train_" + unit, result.last_train},
          {"valid_" + unit, result.last_valid},
          {"lr", ctx.lr},
          {"ms_per_step", ms_per_step},
          {speed_key, static_cast<double>(B * M) * 1e3 / ms_per_step},
          {"elapsed_s", state.elapsed_seconds + elapsed},
          {"eta_s", per_step * static_cast<double>(tc.nb_steps - state.step)},
          {"processes", world},
          {"best_valid_loss", state.best_valid},
      };
      if (examples) {  // the loss is already in nats; the accuracy is what users read
        record.erase("train_" + unit);
        record.erase("valid_" + unit);
        record["valid_acc"] = valid_accuracy;
      }
      if (group) {
        record["allreduce_ms_per_step"] = (group->collective_seconds() - interval_collective) * 1e3 / interval_steps;
        interval_collective = group->collective_seconds();
      }
      std::string extra;
      if (examples) family.report_score(valid_score, "valid_", record, extra);
      family.log_extras(state.step, record, extra);
      if (main_rank) log << record.dump() << std::endl;
      const std::string line = fmt::format(
          "step {:>7} | train {:.3f} {} | valid {:.3f} {}{} | {:.0f} ms/step | {:.0f} {} | left {}{}", state.step,
          result.last_train, unit, result.last_valid, unit,
          examples ? fmt::format(" | valid acc {:.2f}%", 100 * valid_accuracy) : "", ms_per_step,
          static_cast<double>(B * M) * 1e3 / ms_per_step, speed_unit,
          format_duration(per_step * static_cast<double>(tc.nb_steps - state.step)), extra);
      if (main_rank && options.progress) fmt::print(stderr, "{}{}\n", tty ? "\r" : "", line);
      if (text_log.is_open()) text_log << fmt::format("[{}] {}", utc_timestamp(), line) << std::endl;
      if (best) save(best_path);
      interval_loss = 0;
      interval_steps = 0;
      interval_start = now_seconds();
    }
    if (state.step % checkpoint_every == 0 || state.step == last_step) save(checkpoint_path);
  }
  result.steps = state.step;
  result.session_steps = state.step - first_step;
  return result;
}

}  // namespace spanformer::train
