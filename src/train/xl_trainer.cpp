#include "spanformer/train/xl_trainer.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/nn/gumbel.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/train/evaluate.h"
#include "spanformer/train/trainer.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/torch_compat.h"

namespace spanformer::train::xl {

using models::xl::XlModel;

double temperature(const XlSearchConfig& c, int64_t k, int64_t nb_steps) {
  const double t = std::min(1.0, static_cast<double>(k) / static_cast<double>(std::max<int64_t>(1, nb_steps)));
  if (c.tau_schedule == TauSchedule::kConstant) return c.tau0;
  if (c.tau_schedule == TauSchedule::kLinear) return c.tau0 + (c.tau1 - c.tau0) * t;
  return c.tau0 * std::pow(c.tau1 / c.tau0, t);
}

torch::Tensor train_step(XlModel& model, Optimizer& optimizer, Optimizer* arch, const torch::Tensor& x,
                         const torch::Tensor& y, int64_t scored, std::vector<torch::Tensor>& mems, int64_t batch_split,
                         double lr, double arch_lr, double tau) {
  model->train();
  optimizer.zero_grad();
  const bool search = model->config().search;
  if (search && model->alpha.grad().defined()) model->alpha.mutable_grad().zero_();
  // One noise sample per block for the whole step (all stream groups see the same architecture).
  torch::Tensor noise = search ? nn::gumbel_noise(model->alpha.sizes(), model->alpha.options()) : torch::Tensor();
  const int64_t B = x.size(0), Q = x.size(1), part = B / batch_split;
  const auto lengths = models::xl::Lengths::of(model->config());
  auto loss_sum = torch::zeros({}, x.options().dtype(torch::kFloat));
  std::vector<std::vector<torch::Tensor>> next(mems.size());
  for (int64_t s = 0; s < batch_split; ++s) {
    std::vector<torch::Tensor> part_mems;
    for (auto& m : mems) part_mems.push_back(m.narrow(0, s * part, part));      // (B/split, Mm, H)
    auto xs = x.narrow(0, s * part, part), ys = y.narrow(0, s * part, part);    // (B/split, Q)
    auto w = search ? nn::gumbel_softmax(model->alpha, noise, tau, model->config().search_hard) : torch::Tensor();
    auto h = model->forward(xs, part_mems, lengths, w);                         // (B/split, Q, H)
    auto nll = model->nll(h.narrow(1, Q - scored, scored), ys.narrow(1, Q - scored, scored)).mean();
    ((nll + model->span_loss()) / static_cast<double>(batch_split)).backward();
    loss_sum = loss_sum + nll.detach() / static_cast<double>(batch_split);
    for (size_t b = 0; b < mems.size(); ++b) next[b].push_back(part_mems[b]);
  }
  for (size_t b = 0; b < mems.size(); ++b) mems[b] = batch_split == 1 ? next[b][0] : torch::cat(next[b], 0);
  optimizer.step(lr);
  if (arch) arch->step(arch_lr);
  model->clamp_spans();
  return loss_sum;
}

double EvalResult::ppl() const { return std::exp(nll()); }
double EvalResult::bpc() const { return nll() / std::log(2.0); }

EvalOptions eval_options(const XlConfig& c) {
  EvalOptions o;
  o.batch = c.train.eval_batch_size;
  o.tgt_len = c.model.eval_tgt_len > 0 ? c.model.eval_tgt_len : c.model.tgt_len;
  o.lengths = models::xl::Lengths::of(c.model);
  if (c.model.eval_mem_len >= 0) o.lengths.mem_len = c.model.eval_mem_len;
  if (c.model.eval_clamp_len >= 0) o.lengths.clamp_len = c.model.eval_clamp_len;
  o.lengths.same_length = c.model.eval_same_length;
  return o;
}

EvalResult evaluate(XlModel& model, const data::TokenFile& tokens, const EvalOptions& o,
                    const std::function<void(int64_t, int64_t)>& progress) {
  if (o.batch <= 0 || o.tgt_len <= 0) fail("evaluation needs a positive batch and tgt_len");
  torch::NoGradGuard no_grad;
  model->eval();
  data::Streams streams(tokens, o.batch);
  const int64_t S = streams.length(), B = o.batch;
  const auto device = model->word_emb->tables[0].device();
  auto mems = model->initial_mems(B);
  auto weights = model->config().search ? model->eval_weights() : torch::Tensor();
  const int64_t total = (S - 1 + o.tgt_len - 1) / o.tgt_len;
  EvalResult result;
  for (int64_t i = 0; i < S - 1; i += o.tgt_len) {
    if (o.max_segments > 0 && result.segments >= o.max_segments) break;
    const int64_t seq = std::min(o.tgt_len, S - 1 - i), begin = std::max<int64_t>(0, i - o.lengths.ext_len);
    const int64_t Q = i + seq - begin;
    auto [x, y] = make_block(streams, begin, Q, device);                   // (B, Q)
    auto h = model->forward(x, mems, o.lengths, weights);                  // (B, Q, H)
    auto nll = model->nll(h.narrow(1, Q - seq, seq), y.narrow(1, Q - seq, seq));  // (B, seq)
    result.nll_sum += nll.sum().to(torch::kDouble).item<double>();
    result.tokens += B * seq;
    ++result.segments;
    if (progress) progress(result.segments, o.max_segments > 0 ? std::min(total, o.max_segments) : total);
  }
  model->train();
  return result;
}

// ---- checkpoints -------------------------------------------------------------------------------

std::string checkpoint_format(const std::string& path) {
  if (!file_exists(path)) fail("checkpoint not found: {}", path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception&) {
    fail("{} is not a readable spanformer checkpoint (truncated, corrupt, or another format)", path);
  }
  c10::IValue format;
  if (!archive.try_read("format", format) || !format.isString()) return "";
  return format.toStringRef();
}

void save_checkpoint(const std::string& path, const XlConfig& config, const data::Vocab& vocab, XlModel& model,
                     const Optimizer* optimizer, const Optimizer* arch, const TrainState* state) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kXlCheckpointFormat)));
  archive.write("config", c10::IValue(to_json(config).dump()));
  archive.write("vocab", c10::IValue(data::vocab_to_text(vocab)));
  archive.write("vocab_level", c10::IValue(std::string(vocab.word_level ? "word" : "byte")));
  for (const auto& item : model->named_parameters()) archive.write("model." + item.key(), item.value().detach());
  if (optimizer) optimizer->save(archive, "optim.");
  if (arch) arch->save(archive, "arch_optim.");
  if (state) {
    archive.write("state.step", torch::tensor(state->step));
    archive.write("state.train_pos", torch::tensor(state->train_pos));
    archive.write("state.elapsed_seconds", torch::tensor(state->elapsed_seconds, torch::kDouble));
    archive.write("state.nb_mems", torch::tensor(static_cast<int64_t>(state->mems.size())));
    for (size_t b = 0; b < state->mems.size(); ++b)
      archive.write(fmt::format("state.mem.{}", b), state->mems[b].contiguous().cpu());
    archive.write("state.rng", state->rng_state);
    if (state->cuda_rng_state.defined()) archive.write("state.cuda_rng", state->cuda_rng_state);
  }
  write_atomic_with(path, [&](const std::string& tmp) { archive.save_to(tmp); });
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  const std::string format = checkpoint_format(path);
  if (format == "spanformer-checkpoint-v1")
    fail("{} is an adaptive-span checkpoint, not a Transformer-XL/PAR one", path);
  if (format != kXlCheckpointFormat) fail("{} is not a spanformer Transformer-XL/PAR checkpoint", path);
  archive_.load_from(path);
  c10::IValue config_text, vocab_text, level;
  archive_.read("config", config_text);
  archive_.read("vocab", vocab_text);
  archive_.read("vocab_level", level);
  config_ = xl_config_from_json(nlohmann::json::parse(config_text.toStringRef()), path);
  vocab_.word_level = level.toStringRef() == "word";
  vocab_.tokens = train::vocab_lines(vocab_text.toStringRef());
}

XlModel CheckpointReader::load_model() {
  XlModel model(config_.model);
  load_model_into(model);
  return model;
}

void CheckpointReader::load_model_into(XlModel& model) {
  auto diff = xl_model_difference(model->config(), config_.model);
  if (!diff.empty()) fail("checkpoint {} is for another model: {} (model vs checkpoint)", path_, diff);
  train::read_parameters(archive_, path_, model->named_parameters());
}

void CheckpointReader::load_optimizers(Optimizer& optimizer, Optimizer* arch) {
  optimizer.load(archive_, "optim.");
  if (arch) arch->load(archive_, "arch_optim.");
}

TrainState CheckpointReader::load_state(int64_t nb_blocks) {
  TrainState state;
  auto read_int = [&](const char* key) {
    torch::Tensor t;
    if (!archive_.try_read(key, t)) fail("checkpoint {} has no training state ('{}'); it cannot be resumed", path_, key);
    return t.item<int64_t>();
  };
  state.step = read_int("state.step");
  state.train_pos = read_int("state.train_pos");
  if (read_int("state.nb_mems") != nb_blocks) fail("checkpoint {} holds memories for another number of blocks", path_);
  torch::Tensor elapsed;
  archive_.read("state.elapsed_seconds", elapsed);
  state.elapsed_seconds = elapsed.item<double>();
  for (int64_t b = 0; b < nb_blocks; ++b) {
    torch::Tensor m;
    archive_.read(fmt::format("state.mem.{}", b), m);
    state.mems.push_back(m);
  }
  archive_.read("state.rng", state.rng_state);
  archive_.try_read("state.cuda_rng", state.cuda_rng_state);
  return state;
}

// ---- the run -----------------------------------------------------------------------------------

namespace {

OptimizerOptions weight_optimizer(const TrainConfig& t) {
  OptimizerOptions o;
  o.kind = t.optim;
  o.grad_clip = t.grad_clip;
  return o;
}

OptimizerOptions arch_optimizer(const XlSearchConfig& s) {
  OptimizerOptions o;
  o.kind = OptimKind::kAdam;
  o.weight_decay = s.arch_weight_decay;
  return o;
}

double in_unit(double nll, bool words) { return words ? std::exp(nll) : nll / std::log(2.0); }

}  // namespace

RunResult run_training(const XlConfig& config_in, const RunOptions& options) {
  XlConfig config = config_in;
  const auto& tc = config.train;
  if (tc.data.empty()) fail("no data: set train.data in the config or pass --data DIR");
  data::Corpus corpus = data::load_corpus(tc.data);
  const bool words = corpus.vocab.word_level;
  if (config.model.vocab_size == 0) config.model.vocab_size = corpus.vocab.size();
  if (config.model.vocab_size != corpus.vocab.size())
    fail("config vocab_size {} does not match the data's vocabulary ({} tokens in {})", config.model.vocab_size,
         corpus.vocab.size(), tc.data);
  validate(config);
  set_threads(static_cast<int>(tc.threads));
  const std::string checkpoint_path = options.out_dir + "/checkpoint.pt";
  const std::string log_path = options.out_dir + "/log.jsonl";
  make_dirs(options.out_dir);

  const torch::Device device = parse_device(tc.device);
  torch::manual_seed(tc.seed);
  XlModel model(config.model);
  model->to(device);
  Optimizer optimizer(model->weight_parameters(), weight_optimizer(tc));
  std::unique_ptr<Optimizer> arch;
  if (config.model.search) arch = std::make_unique<Optimizer>(model->arch_parameters(), arch_optimizer(config.search));
  const int64_t B = tc.batch_size, M = config.model.tgt_len, E = config.model.ext_len;
  data::Streams train_streams(*corpus.train, B);
  if (train_streams.length() <= M + 1) fail("{}/train.bin is too short for {} streams of segments of {}", tc.data, B, M);

  TrainState state;
  if (options.resume && file_exists(checkpoint_path)) {
    CheckpointReader reader(checkpoint_path);
    reader.load_model_into(model);
    reader.load_optimizers(optimizer, arch.get());
    state = reader.load_state(model->blocks().size());
    if (!state.mems.empty() && state.mems[0].size(0) != B)
      fail("checkpoint {} was trained with batch_size {}, the config says {}", checkpoint_path, state.mems[0].size(0), B);
    for (auto& m : state.mems) m = m.to(device);
    compat::set_generator_state(c10::DeviceType::CPU, state.rng_state);
    if (device.is_cuda() && state.cuda_rng_state.defined())
      compat::set_generator_state(c10::DeviceType::CUDA, state.cuda_rng_state);
    fmt::print(stderr, "spanformer: resumed {} at step {}\n", checkpoint_path, state.step);
  } else {
    if (options.resume) fmt::print(stderr, "spanformer: no checkpoint in {}, starting a new run\n", options.out_dir);
    state.mems = model->initial_mems(B);
    std::ofstream(log_path, std::ios::trunc);
  }
  write_file_atomic(options.out_dir + "/config.json", to_json(config).dump(2) + "\n");

  install_interrupt_handler();
  std::ofstream log(log_path, std::ios::app);
  const bool tty = options.progress && isatty(STDERR_FILENO);
  const int64_t first_step = state.step;
  const int64_t last_step = options.stop_after >= 0 ? std::min(tc.nb_steps, first_step + options.stop_after) : tc.nb_steps;
  const int64_t checkpoint_every = tc.checkpoint_interval > 0 ? tc.checkpoint_interval : tc.eval_interval;
  const double session_start = now_seconds();
  const char* unit = words ? "ppl" : "bpc";
  auto save = [&] {
    state.rng_state = compat::generator_state(c10::DeviceType::CPU);
    if (device.is_cuda()) state.cuda_rng_state = compat::generator_state(c10::DeviceType::CUDA);
    TrainState to_save = state;
    to_save.elapsed_seconds = state.elapsed_seconds + (now_seconds() - session_start);
    save_checkpoint(checkpoint_path, config, corpus.vocab, model, &optimizer, arch.get(), &to_save);
  };
  EvalOptions valid_options;
  valid_options.batch = B;
  valid_options.tgt_len = M;
  valid_options.lengths = models::xl::Lengths::of(config.model);
  valid_options.max_segments = tc.eval_blocks;

  RunResult result;
  result.unit = unit;
  double interval_loss = 0, interval_start = now_seconds();
  int64_t interval_steps = 0;
  while (state.step < last_step) {
    if (interrupted()) {
      save();
      fmt::print(stderr, "\nspanformer: checkpoint saved at step {} in {}\n", state.step, checkpoint_path);
      result.interrupted = true;
      break;
    }
    const int64_t k = state.step + 1;
    const int64_t e = std::min(E, state.train_pos);
    auto [x, y] = make_block(train_streams, state.train_pos - e, e + M, device);  // (B, e + M)
    const double lr = learning_rate(tc, k);
    const double tau = config.model.search ? temperature(config.search, k, tc.nb_steps) : 1.0;
    const bool arch_step = arch && k > config.search.arch_freeze_steps;
    auto loss = train_step(model, optimizer, arch_step ? arch.get() : nullptr, x, y, M, state.mems, tc.batch_split,
                           lr, config.search.arch_lr, tau);
    const double loss_value = loss.item<double>();
    if (!std::isfinite(loss_value))
      fail("training diverged at step {}: the loss is {} (lower lr; the last checkpoint is kept)", k, loss_value);
    state.step = k;
    interval_loss += loss_value;
    ++interval_steps;
    state.train_pos += M;
    if (state.train_pos + M > train_streams.length() - 1) {  // no full segment left: next epoch
      state.train_pos = 0;
      state.mems = model->initial_mems(B);
      for (auto& m : state.mems) m = m.to(device);
    }
    const double elapsed = now_seconds() - session_start;
    const double per_step = elapsed / static_cast<double>(state.step - first_step);
    if (tty)
      fmt::print(stderr, "\r  step {}/{} | train {:.3f} {} | lr {:.2e} | {:.0f} ms/step | {:.0f} tok/s | left {}   ",
                 state.step, tc.nb_steps, in_unit(loss_value, words), unit, lr, per_step * 1e3, B * M / per_step,
                 format_duration(per_step * static_cast<double>(last_step - state.step)));
    if (state.step % tc.eval_interval == 0 || state.step == tc.nb_steps) {
      const double interval_seconds = now_seconds() - interval_start;
      auto valid = evaluate(model, *corpus.valid, valid_options);
      result.last_train = in_unit(interval_loss / static_cast<double>(interval_steps), words);
      result.last_valid = in_unit(valid.nll(), words);
      const double ms_per_step = interval_seconds * 1e3 / static_cast<double>(interval_steps);
      nlohmann::json record = {{"step", state.step},
                               {std::string("train_") + unit, result.last_train},
                               {std::string("valid_") + unit, result.last_valid},
                               {"train_nll", interval_loss / static_cast<double>(interval_steps)},
                               {"valid_nll", valid.nll()},
                               {"lr", lr},
                               {"ms_per_step", ms_per_step},
                               {"tokens_per_s", static_cast<double>(B * M) * 1e3 / ms_per_step},
                               {"elapsed_s", state.elapsed_seconds + elapsed}};
      std::string extra;
      if (config.model.search) {
        auto p = model->probs().to(torch::kCPU, torch::kDouble);  // (N, 3)
        std::vector<std::vector<double>> rows;
        std::string argmax;
        for (int64_t b = 0; b < p.size(0); ++b) {
          rows.push_back({p[b][0].item<double>(), p[b][1].item<double>(), p[b][2].item<double>()});
          argmax += "afi"[p[b].argmax().item<int64_t>()];
        }
        record["tau"] = tau;
        record["probs"] = rows;
        record["argmax"] = argmax;
        extra = fmt::format(" | tau {:.3f} | argmax {}", tau, argmax);
      }
      if (config.model.adapt_span) {
        std::vector<double> mean;
        for (const auto& z : model->spans()) {
          double s = 0;
          for (double v : z) s += v;
          mean.push_back(s / static_cast<double>(z.size()));
        }
        record["span_mean"] = mean;
        extra += fmt::format(" | spans {:.0f}", fmt::join(mean, " "));
      }
      log << record.dump() << std::endl;
      if (options.progress)
        fmt::print(stderr, "{}step {:>7} | train {:.3f} {} | valid {:.3f} {} | {:.0f} ms/step | {:.0f} tok/s | left {}{}\n",
                   tty ? "\r" : "", state.step, result.last_train, unit, result.last_valid, unit, ms_per_step,
                   static_cast<double>(B * M) * 1e3 / ms_per_step,
                   format_duration(per_step * static_cast<double>(tc.nb_steps - state.step)), extra);
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

}  // namespace spanformer::train::xl
