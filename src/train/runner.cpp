#include "spanformer/train/runner.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <unistd.h>

#include <cmath>

#include <fmt/format.h>

#include "run_parts.h"
#include "spanformer/dist/group.h"
#include "spanformer/dist/reducer.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/version.h"

namespace spanformer::train {

void check_batch_splits(const TrainConfig& tc, int world) {
  if (tc.batch_size % world != 0 || (tc.batch_size / world) % tc.batch_split != 0)
    fail("batch_size {} must divide by the number of processes ({}) times batch_split ({})", tc.batch_size, world,
         tc.batch_split);
}

namespace {

using run::Position;

// The shard of this process: B / W streams (or examples) each, refused unless B divides.
run::Shard make_shard(dist::Group* group, const TrainConfig& tc) {
  run::Shard s;
  s.group = group;
  s.world = group ? group->world() : 1;
  s.rank = group ? group->rank() : 0;
  s.batch = tc.batch_size;
  check_batch_splits(tc, s.world);
  s.local = tc.batch_size / s.world;
  s.first = s.rank * s.local;
  return s;
}

// Same model, optimisation and code on every rank (paths and thread counts may differ).
void check_ranks_agree(Family& family, dist::Group& group) {
  auto shared = family.config_json();
  shared["train"].erase("data");
  shared["train"].erase("threads");
  group.check_same_as_main("config", shared.dump());
  group.check_same_as_main("code version", std::string(kVersion) + " torch " + compat::torch_version());
}

// Resume from the run's checkpoint: weights, optimizers, position, data state and random generators.
Position resume_from(const std::string& path, Family& family, run::Batches& batches, torch::Device device) {
  Checkpoint ck(path);
  family.load_weights(ck);
  family.load_optimizers(ck);
  if (!ck.has_train_state()) fail("checkpoint {} has no training state; it cannot be resumed", path);
  batches.check_same_data(ck);
  Position p;
  p.step = ck.integer("state.step");
  p.train_pos = ck.integer("state.train_pos");
  if (ck.has("state.valid_pos")) p.valid_pos = ck.integer("state.valid_pos");
  p.elapsed_seconds = ck.number("state.elapsed_seconds");
  if (ck.has("state.best_valid")) p.best_valid = ck.number("state.best_valid");
  if (ck.has("state.interval_steps")) {  // checkpoints written before these keys resume a fresh interval
    p.interval_loss = ck.number("state.interval_loss");
    p.interval_steps = ck.integer("state.interval_steps");
    if (p.interval_steps < 0 || !std::isfinite(p.interval_loss))
      fail("checkpoint {} is damaged: its open interval ({} losses, sum {}) is not one", path, p.interval_steps,
           p.interval_loss);
  }
  batches.resume(ck, p);
  compat::set_generator_state(c10::DeviceType::CPU, ck.tensor("state.rng"));
  if (device.is_cuda() && ck.has("state.cuda_rng")) compat::set_generator_state(c10::DeviceType::CUDA, ck.tensor("state.cuda_rng"));
  return p;
}

// A new run (optionally from --init's weights), or the run's checkpoint continued (--resume).
Position start_or_resume(Family& family, run::Batches& batches, run::RunDirectory& dir, const RunOptions& options,
                         torch::Device device, int64_t world) {
  const RunPaths& paths = dir.paths();
  if (options.resume && file_exists(paths.checkpoint())) {
    const Position pos = resume_from(paths.checkpoint(), family, batches, device);
    dir.say(fmt::format("spanformer: resumed {} at step {} ({} process{})", paths.checkpoint(), pos.step, world,
                        world > 1 ? "es" : ""));
    // --resume --init: resume wins once a checkpoint exists (a job relaunched after preemption keeps its
    // progress); --init only seeds the run's first session.
    if (!options.init_from.empty())
      dir.say(fmt::format("spanformer: --init {} is not used: it only starts a new run, and {} has a checkpoint",
                          options.init_from, options.out_dir));
    return pos;
  }
  if (options.resume) dir.say(fmt::format("spanformer: no checkpoint in {}, starting a new run", options.out_dir));
  if (!options.init_from.empty()) {
    Checkpoint init(options.init_from);
    if (!data::same_vocabulary(init.vocab(), batches.data().vocab))
      fail("{} was trained with another vocabulary than {}", options.init_from, family.train().data);
    family.load_weights(init);
    dir.say(fmt::format("spanformer: starting from the weights of {}", options.init_from));
  }
  batches.start();
  dir.start_new();  // a new run starts new logs and leaves no checkpoint of the run it replaces
  return {};
}

// What the family's step needs besides the batch.
StepContext step_context(const TrainConfig& tc, int64_t step, dist::Group* group, dist::GradientReducer* reducer,
                         torch::Device device) {
  StepContext ctx;
  ctx.step = step;
  ctx.lr = learning_rate(tc, step);
  ctx.group = group;
  ctx.reducer = reducer;
  ctx.amp = tc.amp;
  ctx.device_type = device.type();
  return ctx;
}

// The run's state at `pos` into `path` (collective: every rank calls it at the same steps; the main
// rank writes). `session_seconds`: this session's time so far.
void save_checkpoint(const std::string& path, Family& family, const run::Batches& batches, const Position& pos,
                     double session_seconds, torch::Device device, const run::Shard& shard) {
  auto gather = [&](const torch::Tensor& t) { return shard.group ? shard.group->all_gather_cat(t.cpu()) : t.cpu(); };
  CheckpointWriter out(family.name(), family.config_json(), batches.data().vocab);
  for (const auto& item : family.module().named_parameters()) out.put("model." + item.key(), item.value());
  family.save_optimizers(out);
  out.put_int("state.step", pos.step);
  out.put_int("state.train_pos", pos.train_pos);
  out.put_int("state.valid_pos", pos.valid_pos);
  batches.save_identity(out);
  out.put_double("state.elapsed_seconds", pos.elapsed_seconds + session_seconds);
  out.put_double("state.best_valid", pos.best_valid);
  out.put_double("state.interval_loss", pos.interval_loss);
  out.put_int("state.interval_steps", pos.interval_steps);
  out.put("state.rng", compat::generator_state(c10::DeviceType::CPU));
  if (device.is_cuda()) out.put("state.cuda_rng", compat::generator_state(c10::DeviceType::CUDA));
  batches.save_state(out, gather);
  if (shard.rank == 0) out.save(path);
}

}  // namespace

RunResult run_training(Family& family, const RunOptions& options) {
  TrainConfig& tc = family.train();
  if (tc.data.empty()) fail("no data: set train.data in the config or pass --data DIR");
  auto batches = run::open_batches(family, tc);
  family.validate();
  family.check_training_step();
  set_threads(static_cast<int>(tc.threads));
  dist::Group* group = options.group.get();
  const run::Shard shard = make_shard(group, tc);
  if (group) check_ranks_agree(family, *group);
  if (options.out_dir.empty()) fail("no run directory: --out must name a directory");
  run::RunDirectory dir(options.out_dir, shard.rank == 0, options.resume, options.overwrite);
  const RunPaths& paths = dir.paths();

  const torch::Device device = parse_device(tc.device);
  torch::manual_seed(tc.seed);
  family.build();
  family.module().to(device);
  family.make_optimizers();
  std::unique_ptr<dist::GradientReducer> reducer;
  if (group && tc.dist_bucket_kb > 0)
    reducer = std::make_unique<dist::GradientReducer>(options.group, family.module().parameters(), tc.dist_bucket_kb * 1024);
  if (group)
    dir.say(fmt::format("spanformer: {} processes; gradients all-reduced in {}", shard.world,
                        reducer ? fmt::format("{} bucket(s) during backward", reducer->nb_buckets()) : "one bucket after backward"));
  batches->prepare(shard);

  Position pos = start_or_resume(family, *batches, dir, options, device, shard.world);
  if (options.on_started) options.on_started();
  dir.begin_session(family.config_json(), options.command_line, pos.step, shard.world);

  install_interrupt_handler();
  const bool main_rank = shard.rank == 0;
  const bool tty = main_rank && options.progress && isatty(STDERR_FILENO);
  const int64_t first_step = pos.step;
  const int64_t last_step = options.stop_after >= 0 ? std::min(tc.nb_steps, first_step + options.stop_after) : tc.nb_steps;
  const int64_t checkpoint_every = tc.checkpoint_interval > 0 ? tc.checkpoint_interval : tc.eval_interval;
  const double session_start = now_seconds();

  RunResult result;
  result.unit = batches->unit();
  const int64_t items_per_step = tc.batch_size * batches->block();
  run::IntervalLog interval(batches->unit(), batches->data().item + "_per_s", batches->speed_unit(), items_per_step,
                            shard.world);
  interval.carry(pos);  // a resumed run's open interval goes on

  auto save = [&](const std::string& path) {
    interval.save_open(pos);
    save_checkpoint(path, family, *batches, pos, now_seconds() - session_start, device, shard);
  };
  while (pos.step < last_step) {
    if (group ? group->all_reduce_sum(interrupted() ? 1.0 : 0.0) > 0 : interrupted()) {
      save(paths.checkpoint());
      if (tty) fmt::print(stderr, "\n");
      dir.say(fmt::format("spanformer: checkpoint saved at step {} in {}", pos.step, paths.checkpoint()));
      result.interrupted = true;
      break;
    }
    const StepContext ctx = step_context(tc, pos.step + 1, group, reducer.get(), device);
    auto [x, y] = batches->next(pos, ctx.step, device);
    // The one host read of the step.
    double loss = family.train_step(x, y, ctx).item<double>();
    if (group) loss = group->all_reduce_sum(loss) / static_cast<double>(shard.world);
    if (!std::isfinite(loss))
      fail("training diverged at step {}: the loss is {} (lower lr or grad_clip; the last checkpoint is kept)", ctx.step, loss);
    pos.step = ctx.step;
    interval.add(loss);
    batches->advance(pos);

    const double elapsed = now_seconds() - session_start;
    const double per_step = elapsed / static_cast<double>(pos.step - first_step);
    const bool log_progress = dir.progress_due();
    if (tty || log_progress) {  // on a terminal after every step; in train.log every 30 s
      const auto line = interval.progress_line(pos.step, tc.nb_steps, loss, ctx.lr, per_step, last_step - pos.step);
      if (tty) fmt::print(stderr, "\r  {}   ", line);
      if (log_progress) dir.progress(line);
    }

    // Validation only at interval ends and at the end of the run, never at a session stop: a stopped and
    // resumed run then reads exactly the same validation blocks as an uninterrupted one.
    if (pos.step % tc.eval_interval == 0 || pos.step == tc.nb_steps) {
      const double seconds = interval.seconds();
      const auto valid = batches->validate(pos);
      // Checked like every training loss: a NaN or infinite validation is never logged as a result, and
      // this step's checkpoint is not written (the last one, if any, is kept).
      if (!std::isfinite(valid.nll))
        fail("training diverged at step {}: the validation loss is {} (lower lr or grad_clip; the last checkpoint is kept)",
             pos.step, valid.nll);
      const double eta = per_step * static_cast<double>(tc.nb_steps - pos.step);
      bool best = false;
      auto record = interval.close(pos, valid, ctx.lr, seconds, elapsed, eta, group, best);
      std::string extra;
      if (auto* sets = family.as<ExampleSets>()) sets->report_score(valid.score, "valid_", record, extra);
      family.log_extras(pos.step, record, extra);
      dir.record(record);
      const auto line = interval.line(record, eta, valid.accuracy, extra);
      if (main_rank && options.progress) fmt::print(stderr, "{}{}\n", tty ? "\r" : "", line);
      dir.text(line);
      result.last_train = interval.last_train;
      result.last_valid = interval.last_valid;
      result.last_accuracy = valid.accuracy;
      result.evaluated = true;
      if (best) save(paths.best());
      interval.restart();
    }
    if (pos.step % checkpoint_every == 0 || pos.step == last_step) save(paths.checkpoint());
  }
  result.steps = pos.step;
  result.session_steps = pos.step - first_step;
  return result;
}

}  // namespace spanformer::train
