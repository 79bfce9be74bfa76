// Configuration of the Transformer-XL family: Transformer-XL (Dai et al., ACL 2019), the PAR
// Transformer (Mandava et al., 2020, arXiv 2009.04534) and its architecture search.
//
// A config file of this family says `"arch": "xl"` at the top level and has three sections:
//   "model"  the network (names follow kimiyoung/transformer-xl's train.py flags),
//   "search" the PAR super-network's schedule (only read when model.search is true),
//   "train"  the section every family shares (config/train_config.h), with this family's defaults.
// Files written before the shared section (train.warmup_steps, train.eval_segments, train.eval_*_len)
// still read: the old names map to lr_warmup, eval_blocks and model.eval_*.
// `--key=value` overrides work as for adaptive-span configs (bare or "section.key").
//
// Dims legend: B batch (streams), M segment length (tgt_len), Mm memory length (mem_len),
// H = d_model, K = n_head, D = d_head, I = d_inner, E = d_embed, V vocabulary, N blocks.
//
// Each key's meaning is written once, as its help text in src/config/xl_config.cpp (`spanformer config keys` and
// docs/config.md print it); the comments below add only dimension letters and what the help does not say.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/attention/kinds.h"
#include "spanformer/config/train_config.h"

namespace spanformer {

enum class SearchEval { kSoftmax, kArgmax };
enum class TauSchedule { kExp, kLinear, kConstant };
const char* search_eval_name(SearchEval e);
SearchEval parse_search_eval(const std::string& name);
const char* tau_schedule_name(TauSchedule s);
TauSchedule parse_tau_schedule(const std::string& name);

// One block of the stack: attention or feed-forward (the config's `layers` spells them 'a' and 'f', the
// PAR paper's notation), or a super-network's searched mixture of both and the identity (PAR search).
enum class BlockKind { kAttention, kFeedForward, kSearch };
char block_letter(BlockKind kind);                               // 'a' | 'f' | 's'
std::string blocks_text(const std::vector<BlockKind>& blocks);   // "afaf..."

struct XlModelConfig {
  int64_t vocab_size = 0;
  std::string layers;           // block string, 'a' attention / 'f' feed-forward ("" = "af" x n_layer)
  int64_t n_layer = 4;
  int64_t d_model = 256;        // H
  int64_t n_head = 4;           // K
  int64_t d_head = 64;
  int64_t d_inner = 1024;       // I
  int64_t d_embed = 0;
  double dropout = 0.1;
  double dropatt = 0.0;
  int64_t tgt_len = 128;
  int64_t mem_len = 128;
  int64_t ext_len = 0;
  int64_t clamp_len = 0;
  bool same_length = false;
  bool pre_lnorm = false;
  bool untie_r = false;
  bool adaptive = false;
  std::vector<int64_t> cutoffs;
  int64_t div_val = 1;
  bool tie_weight = true;
  bool tie_projs = true;
  double init_std = 0.02;
  double proj_init_std = 0.01;
  // PAR super-network: every one of 2 x n_layer blocks mixes {attention, feed-forward, identity}.
  bool search = false;
  bool search_hard = false;
  SearchEval search_eval = SearchEval::kSoftmax;  // weights without noise at evaluation: softmax | argmax
  // Adaptive span (Sukhbaatar et al. 2019) inside every attention block.
  bool adapt_span = false;
  int64_t attn_span = 0;
  int64_t adapt_span_ramp = 32;        // R
  double adapt_span_init = 1.0;
  double adapt_span_loss = 2e-6;
  // With adapt_span: plain = one masked product over the block's window; fused = each head's product
  // over its own window only; auto = fused when that skips a quarter of the keys or more.
  attention::AttnImpl attn_impl = attention::AttnImpl::kAuto;
  // Evaluation protocol of `spanformer eval` (validation during training uses the training lengths).
  int64_t eval_tgt_len = 0;            // 0 = tgt_len
  int64_t eval_mem_len = -1;           // -1 = mem_len
  int64_t eval_clamp_len = -1;         // -1 = clamp_len
  bool eval_same_length = false;

  int64_t embed_dim() const { return d_embed > 0 ? d_embed : d_model; }
  int64_t span_limit() const { return attn_span > 0 ? attn_span : mem_len + tgt_len; }
  // The blocks of a plain model (`layers`, or "af" x n_layer when it is empty); 2 x n_layer searched
  // blocks for a super-network. `layers` is validated first (validate()).
  std::vector<BlockKind> blocks() const;
  int64_t nb_blocks() const;
};

struct XlSearchConfig {
  double arch_lr = 1e-2;
  double arch_weight_decay = 5e-4;
  int64_t arch_freeze_steps = 0;
  double tau0 = 1.0, tau1 = 0.1;
  TauSchedule tau_schedule = TauSchedule::kExp;  // exp | linear | constant
};

// The Transformer-XL/PAR family's defaults (kimiyoung/transformer-xl's train.py).
TrainConfig xl_train_defaults();

struct XlConfig {
  XlModelConfig model;
  XlSearchConfig search;
  TrainConfig train = xl_train_defaults();  // the shared section (config/train_config.h)
};

nlohmann::json to_json(const XlConfig& config);
nlohmann::json to_json(const XlModelConfig& config);
XlConfig xl_config_from_json(const nlohmann::json& j, const std::string& origin);
XlConfig load_xl_config(const std::string& path);
void apply_overrides(XlConfig& config, const std::vector<std::string>& overrides);


// Throws Error naming the first invalid value.
void validate(const XlModelConfig& config);
// The working memory of one segment of `batch` sequences (tgt tokens over mem of memory), refused in one
// line when it exceeds the machine's; validate(XlConfig) checks training's and evaluation's batches,
// bench its own lengths.
void check_xl_segment_fits(const XlModelConfig& config, double batch, int64_t tgt, int64_t mem, const std::string& names);
void validate(const XlConfig& config);
// A training step's working memory, batch included, against the machine's (train, bench --mode train).
void check_training_step_fits(const XlConfig& config);

// The first key of the model section that differs ("n_layer 4 vs 2"; "" when a checkpoint made under one
// config fits the other). Run and train keys may differ.
std::string model_difference(const XlConfig& a, const XlConfig& b);

}  // namespace spanformer
