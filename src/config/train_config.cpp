#include "spanformer/config/train_config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "train_fields.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"
#include "spanformer/util/io.h"
#include "spanformer/util/run_paths.h"
#include "spanformer/util/jsonl.h"

namespace spanformer {

constexpr auto kOptimNames = name_table("optim", std::pair{OptimKind::kAdagrad, "adagrad"},
                                        std::pair{OptimKind::kSgd, "sgd"}, std::pair{OptimKind::kAdam, "adam"},
                                        std::pair{OptimKind::kAdamW, "adamw"});

const char* optim_name(OptimKind value) { return kOptimNames.name(value); }
OptimKind parse_optim(const std::string& name) { return kOptimNames.parse(name); }

constexpr auto kScheduleNames = name_table("scheduler", std::pair{Schedule::kConstant, "constant"},
                                           std::pair{Schedule::kCosine, "cosine"},
                                           std::pair{Schedule::kInverseSqrt, "inverse_sqrt"});

const char* schedule_name(Schedule value) { return kScheduleNames.name(value); }
Schedule parse_schedule(const std::string& name) { return kScheduleNames.parse(name); }

constexpr auto kAmpNames = name_table("amp", std::pair{Amp::kOff, "off"}, std::pair{Amp::kBf16, "bf16"});

const char* amp_name(Amp value) { return kAmpNames.name(value); }
Amp parse_amp(const std::string& name) { return kAmpNames.parse(name); }

void validate(const TrainConfig& t) {
  config_detail::require_positive("batch_size", t.batch_size);
  config_detail::require_positive("batch_split", t.batch_split);
  if (t.batch_size % t.batch_split != 0)
    fail("config: batch_size ({}) must be divisible by batch_split ({})", t.batch_size, t.batch_split);
  if (!(t.lr > 0 && std::isfinite(t.lr))) fail("config: lr must be positive (got {})", t.lr);
  if (!(t.lr_min >= 0 && t.lr_min <= t.lr)) fail("config: lr_min must be in [0, lr] (got {})", t.lr_min);
  config_detail::require_fraction("momentum", t.momentum);
  config_detail::require_fraction("weight_decay", t.weight_decay);
  if (t.weight_decay > 0 && t.optim != OptimKind::kAdam && t.optim != OptimKind::kAdamW)
    fail("config: weight_decay applies to adam and adamw only (optim is {})", optim_name(t.optim));
  if (!(t.adam_beta2 > 0 && t.adam_beta2 < 1)) fail("config: adam_beta2 must be in (0, 1) (got {})", t.adam_beta2);
  if (!(t.grad_clip >= 0)) fail("config: grad_clip must be >= 0 (got {})", t.grad_clip);
  if (t.lr_warmup < 0) fail("config: lr_warmup must be >= 0 (got {})", t.lr_warmup);
  config_detail::require_positive("nb_steps", t.nb_steps);
  config_detail::require_positive("eval_interval", t.eval_interval);
  if (t.eval_blocks < 0) fail("config: eval_blocks must be >= 0 (got {})", t.eval_blocks);
  if (t.checkpoint_interval < 0) fail("config: checkpoint_interval must be >= 0 (got {})", t.checkpoint_interval);
  if (t.threads < 0) fail("config: threads must be >= 0 (got {})", t.threads);
  if (t.device != "cpu" && t.device.rfind("cuda", 0) != 0)
    fail("config: device must be cpu, cuda or cuda:N (got '{}')", t.device);
  if (t.dist_bucket_kb < 0) fail("config: dist_bucket_kb must be >= 0 (got {})", t.dist_bucket_kb);
  if (!(t.dist_timeout > 0)) fail("config: dist_timeout must be positive (got {})", t.dist_timeout);
  config_detail::require_positive("eval_batch_size", t.eval_batch_size);
}

std::string ConfigKey::described() const {
  std::string names;
  for (const auto& c : choices) names += (names.empty() ? "" : " | ") + c;
  if (names.empty()) return help;
  return "[" + names + "]" + (help.empty() ? "" : " " + help);
}

double learning_rate(const TrainConfig& c, int64_t k) {
  if (c.lr_warmup > 0 && k <= c.lr_warmup) return c.lr * static_cast<double>(k) / static_cast<double>(c.lr_warmup);
  if (c.scheduler == Schedule::kConstant) return c.lr;
  if (c.scheduler == Schedule::kInverseSqrt)
    return c.lr * std::sqrt(static_cast<double>(std::max<int64_t>(1, c.lr_warmup)) / static_cast<double>(k));
  const double t = std::min(1.0, static_cast<double>(k) / static_cast<double>(c.nb_steps));
  return c.lr_min + (c.lr - c.lr_min) * 0.5 * (1.0 + std::cos(M_PI * t));
}

namespace config_detail {

const std::vector<Field<TrainConfig>>& train_fields() {
  using C = TrainConfig;
  static const std::vector<Field<C>> fields = {
      field("data", &C::data, "prepared data directory (train.bin, valid.bin, test.bin, vocab.txt)"),
      field("batch_size", &C::batch_size, "B streams per step (global, over all processes)"),
      field("batch_split", &C::batch_split, "gradient accumulation over B / batch_split stream groups"),
      enum_field("optim", &C::optim, parse_optim, optim_name, "the optimizer (adagrad with the reference's gradient clip)"),
      field("weight_decay", &C::weight_decay, "adamw: decoupled decay of weight matrices (dim >= 2); adam: L2 term"),
      field("adam_beta2", &C::adam_beta2, "adam/adamw second-moment decay"),
      field("lr", &C::lr, "learning rate (after the warmup; see scheduler)"),
      field("lr_min", &C::lr_min, "cosine schedule's floor"),
      enum_field("scheduler", &C::scheduler, parse_schedule, schedule_name, "the learning rate after the warmup"),
      field("lr_warmup", &C::lr_warmup, "linear warmup updates (0 = none)"),
      field("momentum", &C::momentum, "sgd only"),
      field("grad_clip", &C::grad_clip, "adagrad: per-tensor lr scaling; sgd/adam: global norm (0 = none)"),
      field("nb_steps", &C::nb_steps, "total optimizer steps"),
      field("eval_interval", &C::eval_interval, "steps between validations, log records and checkpoints"),
      field("eval_blocks", &C::eval_blocks, "validation blocks per interval (Transformer-XL/PAR: 0 = the whole split)"),
      field("checkpoint_interval", &C::checkpoint_interval, "steps between checkpoints (0 = at every eval_interval)"),
      field("seed", &C::seed, "random seed of weights, data offsets and dropout"),
      field("threads", &C::threads, "0 = all cores"),
      field("eval_batch_size", &C::eval_batch_size, "streams of the full evaluation"),
      field("device", &C::device, "cpu | cuda | cuda:N"),
      enum_field("amp", &C::amp, parse_amp, amp_name,
                 "bf16 = the training forward under bf16 autocast; weights, optimizer and loss stay fp32"),
      field("dist_timeout", &C::dist_timeout, "seconds a rank waits for the others (multi-process runs)"),
      enum_field("dist_backend", &C::dist_backend, dist::parse_backend, dist::backend_name,
                 "auto = gloo on CPU, nccl on CUDA"),
      field("dist_bucket_kb", &C::dist_bucket_kb, "gradient buckets all-reduced during backward (0 = one bucket after it)"),
  };
  return fields;
}

const std::vector<std::pair<std::string, std::string>>& train_key_aliases() {
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"warmup_steps", "lr_warmup"},   // Transformer-XL configs before the shared section
      {"eval_segments", "eval_blocks"},
  };
  return aliases;
}

void read_train_section(TrainConfig& t, const json& j, const std::string& origin,
                        const std::function<bool(const std::string&, const json&)>& other) {
  if (!j.is_object()) fail("{}: 'train' must be a JSON object", origin);
  for (const auto& [key_in, value] : j.items()) {
    std::string key = key_in;
    for (const auto& [old_name, name] : train_key_aliases())
      if (key == old_name) key = name;
    if (key == "cuda_graphs") {  // retired: checkpoints of earlier versions carry it, false
      if (value.is_boolean() && !value.get<bool>()) continue;
      fail("{}: train.cuda_graphs waits in the lab (docs/platform.md, \"Awaiting a GPU\")", origin);
    }
    if (const auto* f = find_field(train_fields(), key)) {
      f->set(t, value);
    } else if (!other || !other(key, value)) {
      fail("{}: unknown config key 'train.{}'", origin, key_in);
    }
  }
}

}  // namespace config_detail
namespace {
double machine_memory() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}
}  // namespace

void check_model_fits(double parameters) {
  const double memory = machine_memory();
  if (!(parameters * 4 <= memory))
    fail("config: the model would have about {:.3g} parameters ({:.1f} GB in float32), more than this machine's {:.1f} GB",
         parameters, parameters * 4 / 1e9, memory / 1e9);
}

double micro_batch(const TrainConfig& train) {
  // This machine's share of the global batch under a multi-machine launcher (torchrun: LOCAL_WORLD_SIZE
  // of WORLD_SIZE processes here; SLURM: SLURM_NTASKS_PER_NODE of SLURM_NTASKS); the whole batch otherwise.
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atof(v) : 0.0;
  };
  double share = 1;
  if (env("WORLD_SIZE") > 0 && env("LOCAL_WORLD_SIZE") > 0) share = env("LOCAL_WORLD_SIZE") / env("WORLD_SIZE");
  else if (env("SLURM_NTASKS") > 0 && env("SLURM_NTASKS_PER_NODE") > 0) share = env("SLURM_NTASKS_PER_NODE") / env("SLURM_NTASKS");
  const int64_t split = std::max<int64_t>(train.batch_split, 1);
  return std::ceil(static_cast<double>(train.batch_size) * std::min(share, 1.0) / static_cast<double>(split));
}

bool step_in_host_memory(const TrainConfig& train) { return train.device.rfind("cuda", 0) != 0; }

void check_working_memory_fits(double floats, const std::string& what) {
  const double memory = machine_memory();
  if (!(floats * 4 <= memory))
    fail("config: {} needs about {:.3g} GB of working memory, more than this machine's {:.1f} GB", what,
         floats * 4 / 1e9, memory / 1e9);
}

nlohmann::json read_config_file(const std::string& path) {
  require_file(path, file_exists(RunPaths(path).config()) ? fmt::format(" (a run directory: its config is {})",
                                                                         RunPaths(path).config())
                                                          : std::string());
  if (sniff_file_kind(path) == FileKind::kZip)
    fail("{} is a checkpoint, not a config file (continue its run: train --resume --out RUN; start from its weights: "
         "--init CHECKPOINT)", path);
  const std::string text = read_file(path);
  std::vector<std::set<std::string>> seen;  // keys of each open object
  std::string duplicate, last_key;
  auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    check_json_depth(depth, path);
    if (event == E::object_start) seen.resize(static_cast<size_t>(depth) + 1), seen[depth].clear();
    if (event == E::key) last_key = parsed.get<std::string>();
    if (event == E::key && duplicate.empty() && !seen[depth - 1].insert(last_key).second) duplicate = last_key;
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::out_of_range&) {  // a number such as 1e999
    fail("{}: the value of key '{}' is out of range for a number", path, last_key);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path, one_line_message(e));
  }
  if (!duplicate.empty()) fail("{}: key '{}' is given twice in one object", path, duplicate);
  return j;
}

}  // namespace spanformer
