#include "spanformer/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/train/evaluate.h"
#include "spanformer/dist/group.h"
#include "spanformer/version.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/torch_compat.h"

namespace spanformer::train {

OptimizerOptions optimizer_options(const TrainConfig& c) {
  OptimizerOptions o;
  o.kind = c.optim;
  o.momentum = c.momentum;
  o.grad_clip = c.grad_clip;
  return o;
}

torch::Tensor train_step(models::TransformerSeq& model, Optimizer& optimizer, const torch::Tensor& x,
                         const torch::Tensor& y, std::vector<torch::Tensor>& caches, int64_t batch_split, double lr,
                         dist::Group* group, dist::GradientReducer* reducer) {
  model->train();
  optimizer.zero_grad();
  const int64_t B = x.size(0), part = B / batch_split;
  auto loss_sum = torch::zeros({}, x.options().dtype(torch::kFloat));
  std::vector<std::vector<torch::Tensor>> next(caches.size());
  for (int64_t s = 0; s < batch_split; ++s) {
    std::vector<torch::Tensor> part_caches;
    for (auto& c : caches) part_caches.push_back(c.narrow(0, s * part, part));  // (B/split, C_l, H)
    auto xs = x.narrow(0, s * part, part), ys = y.narrow(0, s * part, part);   // (B/split, M)
    auto logits = model->logits(model->forward(xs, part_caches));              // (B/split, M, V)
    auto nll = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), ys.reshape({-1}));
    if (reducer && s == batch_split - 1) reducer->arm();  // this backward completes the gradients
    ((nll + model->span_loss()) / static_cast<double>(batch_split)).backward();
    loss_sum = loss_sum + nll.detach() / static_cast<double>(batch_split);
    for (size_t l = 0; l < caches.size(); ++l) next[l].push_back(part_caches[l]);
  }
  for (size_t l = 0; l < caches.size(); ++l) caches[l] = batch_split == 1 ? next[l][0] : torch::cat(next[l], 0);
  if (reducer) {
    reducer->finish();  // buckets were all-reduced while backward ran
  } else if (group) {
    // Every rank's loss is a mean over its equal share of the streams: the mean of the ranks'
    // gradients is the gradient of the global batch. One bucket, one all-reduce.
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters())
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    group->all_reduce_mean(grads);
  }
  optimizer.step(lr);
  model->clamp_spans();
  return loss_sum;
}

namespace {

std::vector<std::pair<std::string, torch::Tensor>> named_params(models::TransformerSeq& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void zero_(std::vector<torch::Tensor>& caches) {
  for (auto& c : caches) c = torch::zeros_like(c);
}

}  // namespace

torch::Device parse_device(const std::string& name) {
  try {
    torch::Device device(name);
    if (device.is_cuda() && !torch::cuda::is_available())
      fail("device '{}' asked for, but no CUDA device is available to this LibTorch build", name);
    return device;
  } catch (const c10::Error&) {
    fail("unknown device '{}' (cpu, cuda or cuda:N)", name);
  }
}

RunResult run_training(const Config& config_in, const RunOptions& options) {
  Config config = config_in;
  const auto& tc = config.train;
  if (tc.data.empty()) fail("no data: set train.data in the config or pass --data DIR");
  data::Corpus corpus = data::load_corpus(tc.data);
  if (config.model.vocab_size == 0) config.model.vocab_size = corpus.vocab.size();
  if (config.model.vocab_size != corpus.vocab.size())
    fail("config vocab_size {} does not match the data's vocabulary ({} tokens in {}/vocab.txt)",
         config.model.vocab_size, corpus.vocab.size(), tc.data);
  validate(config);
  set_threads(static_cast<int>(tc.threads));
  dist::Group* group = options.group.get();
  const int64_t world = group ? group->world() : 1, rank = group ? group->rank() : 0;
  const bool main_rank = rank == 0;
  if (tc.batch_size % world != 0 || (tc.batch_size / world) % tc.batch_split != 0)
    fail("batch_size {} must divide by the number of processes ({}) times batch_split ({})", tc.batch_size, world,
         tc.batch_split);
  if (group) {
    // Same model, optimisation and code on every rank (paths and thread counts may differ).
    auto shared = to_json(config);
    shared["train"].erase("data");
    shared["train"].erase("threads");
    group->check_same_as_main("config", shared.dump());
    group->check_same_as_main("code version", std::string(kVersion) + " torch " + compat::torch_version());
  }

  const std::string checkpoint_path = options.out_dir + "/checkpoint.pt";
  const std::string log_path = options.out_dir + "/log.jsonl";
  make_dirs(options.out_dir);

  const torch::Device device = parse_device(tc.device);
  torch::manual_seed(tc.seed);
  models::TransformerSeq model(config.model);
  model->to(device);
  Optimizer optimizer(named_params(model), optimizer_options(tc));
  std::unique_ptr<dist::GradientReducer> reducer;
  if (options.group && tc.dist_bucket_kb > 0)
    reducer = std::make_unique<dist::GradientReducer>(options.group, model->parameters(), tc.dist_bucket_kb * 1024);
  if (group && main_rank)
    fmt::print(stderr, "spanformer: {} processes; gradients all-reduced in {}\n", world,
               reducer ? fmt::format("{} bucket(s) during backward", reducer->nb_buckets()) : "one bucket after backward");
  const int64_t B = tc.batch_size, M = config.model.block_size;
  const int64_t local = B / world, first = rank * local;  // this rank's streams [first, first + local)
  data::Streams train_streams(*corpus.train, B), valid_streams(*corpus.valid, B);
  if (train_streams.length() <= 2 * M) fail("{}/train.bin is too short for {} streams of blocks of {}", tc.data, B, M);
  if (valid_streams.length() <= 2 * M) fail("{}/valid.bin is too short for {} streams of blocks of {}", tc.data, B, M);

  TrainState state;
  if (options.resume && file_exists(checkpoint_path)) {
    CheckpointReader reader(checkpoint_path);
    reader.load_model_into(model);
    reader.load_optimizer(optimizer);
    state = reader.load_state(config.model.nb_layers);
    if (state.train_caches[0].size(0) != B)
      fail("checkpoint {} was trained with batch_size {}, the config says {}", checkpoint_path,
           state.train_caches[0].size(0), B);
    for (auto& c : state.train_caches) c = c.to(device);
    for (auto& c : state.valid_caches) c = c.to(device);
    compat::set_generator_state(c10::DeviceType::CPU, state.rng_state);
    if (device.is_cuda() && state.cuda_rng_state.defined())
      compat::set_generator_state(c10::DeviceType::CUDA, state.cuda_rng_state);
    // Caches are saved for all B streams: each rank takes its own, whatever W was before.
    for (auto& c : state.train_caches) c = c.narrow(0, first, local).contiguous();
    for (auto& c : state.valid_caches) c = c.narrow(0, first, local).contiguous();
    if (main_rank) fmt::print(stderr, "spanformer: resumed {} at step {} ({} process{})\n", checkpoint_path, state.step,
                              world, world > 1 ? "es" : "");
  } else {
    if (options.resume) fmt::print(stderr, "spanformer: no checkpoint in {}, starting a new run\n", options.out_dir);
    if (!options.init_from.empty()) {
      CheckpointReader init(options.init_from);
      if (data::vocab_to_text(init.vocab()) != data::vocab_to_text(corpus.vocab))
        fail("{} was trained with another vocabulary than {}/vocab.txt", options.init_from, tc.data);
      init.load_model_into(model);
      fmt::print(stderr, "spanformer: starting from the weights of {}\n", options.init_from);
    }
    state.train_caches = model->initial_caches(local);
    state.valid_caches = model->initial_caches(local);
    if (main_rank) std::ofstream(log_path, std::ios::trunc);  // a new run starts a new log
  }
  if (main_rank) write_file_atomic(options.out_dir + "/config.json", to_json(config).dump(2) + "\n");

  install_interrupt_handler();
  std::ofstream log;
  if (main_rank) log.open(log_path, std::ios::app);
  const bool tty = main_rank && options.progress && isatty(STDERR_FILENO);
  const int64_t first_step = state.step;
  const int64_t last_step = options.stop_after >= 0 ? std::min(tc.nb_steps, first_step + options.stop_after) : tc.nb_steps;
  const int64_t checkpoint_every = tc.checkpoint_interval > 0 ? tc.checkpoint_interval : tc.eval_interval;
  const double session_start = now_seconds();

  auto save = [&] {  // collective: every rank calls it at the same steps
    state.rng_state = compat::generator_state(c10::DeviceType::CPU);
    if (device.is_cuda()) state.cuda_rng_state = compat::generator_state(c10::DeviceType::CUDA);
    TrainState to_save = state;
    to_save.elapsed_seconds = state.elapsed_seconds + (now_seconds() - session_start);
    if (group) {
      for (auto& c : to_save.train_caches) c = group->all_gather_cat(c.cpu());  // (B, C_l, H)
      for (auto& c : to_save.valid_caches) c = group->all_gather_cat(c.cpu());
    }
    if (main_rank) save_checkpoint(checkpoint_path, config, corpus.vocab, model, &optimizer, &to_save);
  };

  RunResult result;
  double interval_loss = 0, interval_start = now_seconds(), interval_collective = 0;
  int64_t interval_steps = 0;
  while (state.step < last_step) {
    const bool stop = group ? group->all_reduce_sum(interrupted() ? 1.0 : 0.0) > 0 : interrupted();
    if (stop) {
      save();
      if (main_rank) fmt::print(stderr, "spanformer: checkpoint saved at step {} in {}\n", state.step, checkpoint_path);
      result.interrupted = true;
      break;
    }
    auto [x, y] = make_block(train_streams, state.train_pos, M, device, first, local);
    const double lr = learning_rate(tc, state.step + 1);
    auto loss = train_step(model, optimizer, x, y, state.train_caches, tc.batch_split, lr, group, reducer.get());
    double loss_value = loss.item<double>();  // the one host read of the step
    if (group) loss_value = group->all_reduce_sum(loss_value) / static_cast<double>(world);
    if (!std::isfinite(loss_value)) {
      fail("training diverged at step {}: the loss is {} (lower lr or grad_clip; the last checkpoint is kept)",
           state.step + 1, loss_value);
    }
    ++state.step;
    interval_loss += loss_value;
    ++interval_steps;
    state.train_pos += M;
    if (state.train_pos >= train_streams.length() - M) {
      // End of the data: restart at a random offset with empty caches (the reference's rule).
      state.train_pos = torch::randint(M, {1}, torch::kLong).item<int64_t>();
      zero_(state.train_caches);
    }

    const double elapsed = now_seconds() - session_start;
    const double per_step = elapsed / static_cast<double>(state.step - first_step);
    if (tty) {
      fmt::print(stderr, "\r  step {}/{} | train {:.3f} bpc | {:.0f} ms/step | {:.0f} tok/s | left {}   ", state.step,
                 tc.nb_steps, loss_value / std::log(2.0), per_step * 1e3, B * M / per_step,
                 format_duration(per_step * static_cast<double>(last_step - state.step)));
    }

    // Validation only at interval ends and at the end of the run, never at a session stop: a stopped and
    // resumed run then reads exactly the same validation blocks as an uninterrupted one.
    const bool interval_end = state.step % tc.eval_interval == 0 || state.step == tc.nb_steps;
    if (interval_end) {
      // Validation on eval_blocks blocks, continuing the valid streams (reference: nbatches / 10).
      const double interval_seconds = now_seconds() - interval_start;
      torch::Tensor valid_sum = torch::zeros({}, torch::kDouble);
      {
        torch::NoGradGuard no_grad;
        model->eval();
        for (int64_t i = 0; i < tc.eval_blocks; ++i) {
          auto [vx, vy] = make_block(valid_streams, state.valid_pos, M, device, first, local);
          valid_sum = valid_sum + eval_block(model, vx, vy, state.valid_caches).to(torch::kCPU, torch::kDouble);
          state.valid_pos += M;
          if (state.valid_pos >= valid_streams.length() - M) {
            state.valid_pos = 0;
            zero_(state.valid_caches);
          }
        }
        model->train();
      }
      result.last_train_bpc = interval_loss / interval_steps / std::log(2.0);
      double valid_nll = valid_sum.item<double>();
      if (group) valid_nll = group->all_reduce_sum(valid_nll) / static_cast<double>(world);
      result.last_valid_bpc = valid_nll / tc.eval_blocks / std::log(2.0);
      const double ms_per_step = interval_seconds * 1e3 / interval_steps;
      nlohmann::json record = {
          {"step", state.step},
          {"train_bpc", result.last_train_bpc},
          {"valid_bpc", result.last_valid_bpc},
          {"lr", lr},
          {"ms_per_step", ms_per_step},
          {"tokens_per_s", B * M * 1e3 / ms_per_step},
          {"elapsed_s", state.elapsed_seconds + elapsed},
          {"eta_s", per_step * static_cast<double>(tc.nb_steps - state.step)},
          {"processes", world},
      };
      if (group) {
        record["allreduce_ms_per_step"] = (group->collective_seconds() - interval_collective) * 1e3 / interval_steps;
        interval_collective = group->collective_seconds();
      }
      std::vector<double> span_mean, span_max;
      for (const auto& z : model->spans()) {
        double sum = 0, mx = 0;
        for (double v : z) sum += v, mx = std::max(mx, v);
        span_mean.push_back(sum / static_cast<double>(z.size()));
        span_max.push_back(mx);
      }
      record["span_mean"] = span_mean;
      record["span_max"] = span_max;
      if (main_rank) log << record.dump() << std::endl;
      if (main_rank && options.progress) {
        fmt::print(stderr, "{}step {:>7} | train {:.3f} bpc | valid {:.3f} bpc | {:.0f} ms/step | {:.0f} tok/s | spans {:.0f} | left {}\n",
                   tty ? "\r" : "", state.step, result.last_train_bpc, result.last_valid_bpc, ms_per_step,
                   B * M * 1e3 / ms_per_step, fmt::join(span_mean, " "),
                   format_duration(per_step * static_cast<double>(tc.nb_steps - state.step)));
      }
      interval_loss = 0;
      interval_steps = 0;
      interval_start = now_seconds();
    }
    if (state.step % checkpoint_every == 0 || state.step == last_step) save();
  }
  result.steps = state.step;
  result.session_steps = state.step - first_step;
  return result;
}

}  // namespace spanformer::train
