// The `train` section every model family shares: data, optimisation, schedule, validation cadence,
// checkpoints, devices and data parallelism. One struct, one key table, one validation, one learning-
// rate rule; a family only chooses its defaults, beside its own config (adaptive span: the reference's
// Adagrad recipe, these; xl_config.h: kimiyoung/transformer-xl's Adam + cosine recipe; ...).
//
// Learning rate of update k = 1, 2, ... (one home for the formula):
//   k <= lr_warmup:  lr * k / lr_warmup
//   constant:        lr
//   cosine:          lr_min + (lr - lr_min) (1 + cos(pi min(1, k / nb_steps))) / 2
//   inverse_sqrt:    lr sqrt(max(1, lr_warmup) / k)      (Vaswani et al. 2017, eq. 3, with lr the peak:
//                    d_model^-0.5 lr_warmup^-0.5 in the paper's units)
//
// Each key's meaning is written once, as its help text in src/config/train_config.cpp (`spanformer config keys` and
// docs/config.md print it); the comments below add only dimension letters and what the help does not say.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/dist/backend.h"

namespace spanformer {

enum class OptimKind { kAdagrad, kSgd, kAdam, kAdamW };
enum class Schedule { kConstant, kCosine, kInverseSqrt };
// Mixed precision (train/family.h, accumulate_gradients): the forward of each training step under
// autocast to bfloat16 (matrix products in bf16), the weights, their gradients, the optimizer and the
// loss in float32. No fp16: it would need loss scaling, which bf16's float32 range makes unnecessary.
enum class Amp { kOff, kBf16 };

const char* optim_name(OptimKind kind);
OptimKind parse_optim(const std::string& name);  // one-line error naming the choices
const char* schedule_name(Schedule schedule);
Schedule parse_schedule(const std::string& name);
const char* amp_name(Amp amp);
Amp parse_amp(const std::string& name);

struct TrainConfig {
  std::string data;
  int64_t batch_size = 64;
  int64_t batch_split = 1;
  OptimKind optim = OptimKind::kAdagrad;  // adagrad (reference clip) | sgd | adam | adamw
  double weight_decay = 0.0;       // adamw: decoupled decay of matrices (dim >= 2); adam: L2 term
  double adam_beta2 = 0.999;       // adam/adamw second-moment decay (GPT recipes use 0.95)
  double lr = 0.07;
  double lr_min = 0.0;
  Schedule scheduler = Schedule::kConstant;  // after the warmup: constant | cosine
  int64_t lr_warmup = 8000;
  double momentum = 0.0;           // sgd only
  double grad_clip = 0.03;
  int64_t nb_steps = 150000;
  int64_t eval_interval = 1000;
  int64_t eval_blocks = 100;
  int64_t checkpoint_interval = 0;
  uint64_t seed = 42;
  int64_t threads = 0;             // 0 = OMP_NUM_THREADS if set, else all cores
  int64_t eval_batch_size = 8;
  std::string device = "cpu";
  Amp amp = Amp::kOff;             // off | bf16: training forward under bf16 autocast, fp32 weights and loss
  double dist_timeout = 300;
  dist::Backend dist_backend = dist::Backend::kAuto;  // auto (gloo on CPU, nccl on CUDA) | gloo | nccl
  int64_t dist_bucket_kb = 1024;
};

// One config key, for `spanformer config keys` (each family lists its own: train/registry.h).
struct ConfigKey {
  std::string section, name, type, default_value, help;
  std::vector<std::string> choices;  // type "choice": the names it takes, in order
  // The help line `config keys` prints: a choice's names first ("[a | b | c] help").
  std::string described() const;
};

// Refuses, before anything is allocated, a model whose estimated parameter count does not fit in this
// machine's memory as float32 (absurd sizes such as nb_layers = 1e5 fail here in one line).
void check_model_fits(double parameters);
// One forward's working memory, `floats` float32 values at least (a lower bound the family derives from
// its sizes: one window or segment of one sequence), against this machine's memory: refused in one line
// naming `what` before anything is allocated (a context of 10^8 tokens used to allocate until the
// machine ran out).
void check_working_memory_fits(double floats, const std::string& what);
// The sequences one forward and backward holds at once: batch_size / batch_split, rounded up.
double micro_batch(const TrainConfig& train);
// A training step's working memory against the machine's, where the step runs in it: on a CUDA device the
// activations live in the GPU's memory, whose allocator refuses what does not fit.
bool step_in_host_memory(const TrainConfig& train);
// Floats a token keeps for the backward through one layer of width H and feed-forward width I: the
// projections and attention output (4 H), the two norms and residuals (4 H), the feed-forward hidden
// and its activation (2 I), rounded up to 10 H + 2 I. A step's estimate is this times the layers and
// tokens of a micro-batch, plus its logits and their gradient (2 V a token): a lower bound (no
// attention scores, no allocator slack), so that no run that fits is refused.
inline double kept_per_token(double H, double I) { return 10 * H + 2 * I; }

// A config file as JSON: one-line errors for missing, unreadable and invalid files, and for a key
// given twice in one object (JSON parsers would keep the last silently).
nlohmann::json read_config_file(const std::string& path);

// Throws Error naming the first invalid value.
void validate(const TrainConfig& config);

// The learning rate of update k (counting from 1), by the formula above.
double learning_rate(const TrainConfig& config, int64_t k);

}  // namespace spanformer
