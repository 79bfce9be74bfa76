// Configuration of the seq2seq family: translation of sentence pairs (data/pairs.h) by a recurrent
// encoder-decoder (without attention, with Bahdanau's or with Luong's) or by the encoder-decoder
// Transformer (Vaswani et al. 2017) - models/seq2seq.h.
//
// A config file says `"arch": "seq2seq"` and has three sections: "model" (below), "data" (the pairs'
// preparation: PairsOptions, config/pairs_options.h) and "train" (config/train_config.h; this family's defaults:
// Adam with beta2 0.98, linear warmup then inverse square root, batch 128 pairs, global clip 1).
// train.data is the pairs file (fra.txt).
//
// Dims legend: B pairs, S source tokens, T target tokens (+1 for <bos>/<eos>), V joint vocabulary,
// Vt target vocabulary (ids [0, Vt)), H = d_model, K = n_head, I = d_inner, L layers.
//
// Each key's meaning is written once, as its help text in src/config/seq2seq_config.cpp (`spanformer config keys` and
// docs/config.md print it); the comments below add only dimension letters and what the help does not say.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/attention/kinds.h"
#include "spanformer/config/train_config.h"
#include "spanformer/config/pairs_options.h"

namespace spanformer {

enum class Seq2SeqKind {
  kGru,          // GRU encoder-decoder, the source's final state fed to every decoder step (no attention)
  kBahdanau,     // + additive attention, queried by the previous decoder state (Bahdanau et al. 2015)
  kLuong,        // + dot/general attention on the current state, attentional vector (Luong et al. 2015)
  kTransformer,  // encoder-decoder Transformer (Vaswani et al. 2017)
};
const char* seq2seq_kind_name(Seq2SeqKind kind);
Seq2SeqKind parse_seq2seq_kind(const std::string& name);

struct Seq2SeqModelConfig {
  Seq2SeqKind kind = Seq2SeqKind::kTransformer;
  int64_t vocab_size = 0;    // V, taken from the data when 0
  int64_t target_vocab = 0;  // Vt, taken from the data when 0
  int64_t d_model = 256;
  int64_t n_layer = 3;
  int64_t n_head = 4;        // K (Transformer)
  int64_t d_inner = 1024;    // I (Transformer feed-forward; 0 = 4 H)
  double dropout = 0.1;
  attention::ScoreKind score = attention::ScoreKind::kGeneral;  // Luong: dot | general
  bool input_feeding = true;      // Luong: the previous attentional vector joins the decoder's input
  bool bidirectional = false;     // recurrent: the encoder reads the source both ways (H/2 a direction)
  bool deep_output = false;       // Bahdanau: the paper's maxout output over s_{t-1}, y_{t-1} and c_t
  bool pre_norm = false;          // Transformer: LayerNorm before each sublayer (post-norm: the paper's)
  bool share_embeddings = false;  // one table for source, target and output (Press & Wolf 2017)
  int64_t max_positions = 256;    // Transformer: sinusoidal positions table length (no weights)
  double label_smoothing = 0.1;   // training loss (Szegedy et al. 2016); the logged NLL is unsmoothed
  int64_t beam = 4;               // decoding defaults (translate and eval take flags)
  double length_penalty = 1.0;    // beam scores divided by ((5 + |y|) / 6)^alpha (Wu et al. 2016)
  int64_t max_extra = 10;         // decoded tokens <= source length + max_extra

  int64_t inner_dim() const { return d_inner > 0 ? d_inner : 4 * d_model; }
  bool recurrent() const { return kind != Seq2SeqKind::kTransformer; }
};

// The seq2seq family's defaults (Adam beta2 0.98, warmup + inverse square root).
TrainConfig seq2seq_train_defaults();

struct Seq2SeqConfig {
  Seq2SeqModelConfig model;
  data::PairsOptions data;
  TrainConfig train = seq2seq_train_defaults();
};

nlohmann::json to_json(const Seq2SeqConfig& config);
Seq2SeqConfig seq2seq_config_from_json(const nlohmann::json& j, const std::string& origin);
void apply_overrides(Seq2SeqConfig& config, const std::vector<std::string>& overrides);
std::vector<ConfigKey> seq2seq_config_keys();
void validate(const Seq2SeqModelConfig& config);
void validate(const Seq2SeqConfig& config);
// A training step's working memory, batch included, against the machine's (train, bench --mode train).
void check_training_step_fits(const Seq2SeqConfig& config);
// The first key of the model section that differs ("n_layer 4 vs 2"; "" when a checkpoint made under one
// config fits the other). Run and train keys may differ.
std::string model_difference(const Seq2SeqConfig& a, const Seq2SeqConfig& b);

}  // namespace spanformer
