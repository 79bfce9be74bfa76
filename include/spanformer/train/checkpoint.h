// Checkpoints: one zip archive (LibTorch's serialize format) with everything a run needs to continue
// bit for bit: the config, the vocabulary, the parameters, the optimizer state, and the training
// state (step, data positions, caches of the train and valid streams, random generator state).
//
// Keys: "format" = "spanformer-checkpoint-v1", "config" (JSON), "vocab" (vocab.txt text),
// "model.<parameter name>", "optim.*", "state.*". Written atomically (temporary file + rename).
#pragma once
#include <torch/serialize/archive.h>

#include <optional>
#include <string>
#include <vector>

#include "spanformer/config/config.h"
#include "spanformer/data/corpus.h"
#include "spanformer/models/transformer_seq.h"
#include "spanformer/train/optim.h"

namespace spanformer::train {

inline constexpr const char* kCheckpointFormat = "spanformer-checkpoint-v1";

struct TrainState {
  int64_t step = 0;                         // optimizer steps done
  int64_t train_pos = 0, valid_pos = 0;     // positions inside the streams
  std::vector<torch::Tensor> train_caches;  // (B, C_l, H) per layer
  std::vector<torch::Tensor> valid_caches;
  torch::Tensor rng_state;                  // CPU generator state
  torch::Tensor cuda_rng_state;             // CUDA generator state (training on a GPU)
  double elapsed_seconds = 0;               // training time before this session
};

// Writes path atomically. optimizer / state may be null (a model-only checkpoint).
void save_checkpoint(const std::string& path, const Config& config, const data::Vocab& vocab,
                     models::TransformerSeq& model, const Optimizer* optimizer, const TrainState* state);

// A checkpoint opened for reading: its config and vocabulary, ready to restore a model and state.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  const Config& config() const { return config_; }
  const data::Vocab& vocab() const { return vocab_; }
  bool has_train_state();

  // Builds the model described by the checkpoint and loads its parameters (attn_impl: "" keeps the
  // checkpoint's choice, else fused or plain).
  models::TransformerSeq load_model(const std::string& attn_impl = "");
  // Loads parameters into an existing model; the model config must equal the checkpoint's.
  void load_model_into(models::TransformerSeq& model);
  void load_optimizer(Optimizer& optimizer);
  TrainState load_state(int64_t nb_layers);

 private:
  std::string path_;
  torch::serialize::InputArchive archive_;
  Config config_;
  data::Vocab vocab_;
};

// Shared by every checkpoint format: copies the archive's "model.<name>" tensors into `params`, naming
// the checkpoint and the tensor when one is missing or has another shape.
void read_parameters(torch::serialize::InputArchive& archive, const std::string& path,
                     const torch::OrderedDict<std::string, torch::Tensor>& params);
// The lines of a vocabulary stored as text (one token per line).
std::vector<std::string> vocab_lines(const std::string& text);

// Names the first difference between two model configs ("" when they are equal).
std::string model_config_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace spanformer::train
