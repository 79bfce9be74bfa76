// The Transformer-XL/PAR family's config code: its key table (names, sections, help), its train defaults and
// its schema (JSON in and out, overrides, `config keys`, the model section a checkpoint must match).
// The structs, their enums and the model's own validation are in spanformer/config/xl_config.h and
// src/config/: the models (models/, below the families) are built and checked from them.
#include "spanformer/config/xl_config.h"

#include <cmath>

#include "config/schema.h"
#include "spanformer/util/error.h"

namespace spanformer {

TrainConfig xl_train_defaults() {
  TrainConfig t;
  t.batch_size = 22;
  t.optim = OptimKind::kAdam;
  t.lr = 2.5e-4;
  t.scheduler = Schedule::kCosine;
  t.lr_warmup = 0;
  t.grad_clip = 0.25;
  t.nb_steps = 400000;
  t.eval_interval = 4000;
  t.eval_blocks = 0;
  t.seed = 1111;
  t.eval_batch_size = 10;
  return t;
}

namespace {

using nlohmann::json;
using config_detail::Field;
using config_detail::field;
using config_detail::run_key;
using config_detail::find_field;
using config_detail::read_section;
using config_detail::struct_to_json;

const std::vector<Field<XlModelConfig>>& xl_model_fields() {
  using C = XlModelConfig;
  static const std::vector<Field<C>> fields = {
      field("vocab_size", &C::vocab_size, "V; taken from the prepared data when 0"),       field("layers", &C::layers, "block string, 'a' attention / 'f' feed-forward (\"\" = \"af\" x n_layer)"),
      field("n_layer", &C::n_layer, "Transformer-XL layers; the super-network has 2 x n_layer blocks"),             field("d_model", &C::d_model, "H"),
      field("n_head", &C::n_head, "K"),               field("d_head", &C::d_head, "D (K x D need not equal H)"),
      field("d_inner", &C::d_inner, "I"),             field("d_embed", &C::d_embed, "E, embedding width (0 = d_model)"),
      run_key(field("dropout", &C::dropout, "embeddings, positions, attention output, feed-forward, last hidden")),             run_key(field("dropatt", &C::dropatt, "attention probabilities")),
      run_key(field("tgt_len", &C::tgt_len, "M, segment length for training")),             run_key(field("mem_len", &C::mem_len, "Mm, hidden states kept per block")),
      run_key(field("ext_len", &C::ext_len, "extended context: tokens re-read before each segment (not scored)")),             run_key(field("clamp_len", &C::clamp_len, "distances above this use the same position vector (0 = no clamp)")),
      run_key(field("same_length", &C::same_length, "every query sees the same number of keys")),     field("pre_lnorm", &C::pre_lnorm, "LayerNorm before each block instead of after the residual"),
      field("untie_r", &C::untie_r, "a separate (u, v) per attention block instead of one pair for all"),             field("adaptive", &C::adaptive, "adaptive input and adaptive softmax with `cutoffs`"),
      field("cutoffs", &C::cutoffs, "cluster boundaries in the frequency-sorted vocabulary"),             field("div_val", &C::div_val, "cluster i has width E / div_val^i"),
      field("tie_weight", &C::tie_weight, "output cluster weights = input embeddings"),       field("tie_projs", &C::tie_projs, "output projections of clusters 1.. = input projections"),
      field("init_std", &C::init_std, "N(0, init_std) weights; LayerNorm weight N(1, init_std)"),           field("proj_init_std", &C::proj_init_std, "N(0, proj_init_std) for adaptive projections"),
      field("search", &C::search, "PAR super-network: every one of 2 x n_layer blocks mixes {attention, feed-forward, identity}"),               field("search_hard", &C::search_hard, "straight-through one-hot samples instead of soft ones"),
      run_key(config_detail::enum_field("search_eval", &C::search_eval, parse_search_eval, search_eval_name, "weights without noise at evaluation")),
      field("adapt_span", &C::adapt_span, "adaptive span (Sukhbaatar et al. 2019) inside every attention block"),
      field("attn_span", &C::attn_span, "L, the largest span (0 = mem_len + tgt_len)"),         field("adapt_span_ramp", &C::adapt_span_ramp, "R"),
      field("adapt_span_init", &C::adapt_span_init, "initial z / L"), field("adapt_span_loss", &C::adapt_span_loss, "span-loss coefficient"),
      run_key(config_detail::enum_field("attn_impl", &C::attn_impl, attention::parse_attn_impl, attention::attn_impl_name,
                                "with adapt_span: plain = one masked product per block, fused = per-head windows; checkpoints load under any")),
      run_key(field("eval_tgt_len", &C::eval_tgt_len, "evaluation segment length (0 = tgt_len; validation during training uses the training lengths)")),   run_key(field("eval_mem_len", &C::eval_mem_len, "evaluation memory length (-1 = mem_len)")),
      run_key(field("eval_clamp_len", &C::eval_clamp_len, "evaluation clamp_len (-1 = clamp_len)")), run_key(field("eval_same_length", &C::eval_same_length, "evaluation: every query sees the same number of keys")),
  };
  return fields;
}

const std::vector<Field<XlSearchConfig>>& search_fields() {
  using C = XlSearchConfig;
  static const std::vector<Field<C>> fields = {
      field("arch_lr", &C::arch_lr, "Adam on the architecture logits alpha"),         field("arch_weight_decay", &C::arch_weight_decay, "L2 term added to alpha's gradient (PyTorch Adam weight_decay)"),
      field("arch_freeze_steps", &C::arch_freeze_steps, "alpha stays fixed for the first N steps (weights warm up)"), field("tau0", &C::tau0, "Gumbel-softmax temperature from tau0 to tau1 over the run"),
      field("tau1", &C::tau1, "Gumbel-softmax temperature at the end of the run"),
      config_detail::enum_field("tau_schedule", &C::tau_schedule, parse_tau_schedule, tau_schedule_name, "the Gumbel-softmax temperature from tau0 to tau1"),
  };
  return fields;
}

}  // namespace

namespace {

// Older files kept the evaluation protocol (eval_*) in `train`, later ones in `model`: it belongs to the
// run section now, in files and in overrides.
const config_detail::Schema<XlConfig>& xl_schema() {
  static const config_detail::Schema<XlConfig> schema{
      "xl",
      "Transformer-XL/PAR",
      {config_detail::model_section(&XlConfig::model, xl_model_fields),
       config_detail::run_section(&XlConfig::model, xl_model_fields),
       config_detail::section("search", &XlConfig::search, search_fields),
       config_detail::train_section<XlConfig>(&XlConfig::train,
                                              [](XlConfig& c, const std::string& key, const json& v) {
                                                const auto* f = find_field(xl_model_fields(), key);
                                                if (!f || key.rfind("eval_", 0) != 0) return false;
                                                f->set(c.model, v);
                                                return true;
                                              })},
      [](config_detail::Override& o) {
        if (o.section == "train" && o.key.rfind("eval_", 0) == 0 && find_field(xl_model_fields(), o.key)) o.section = "run";
      }};
  return schema;
}

}  // namespace

std::vector<ConfigKey> xl_config_keys() { return xl_schema().keys(); }

json to_json(const XlModelConfig& config) { return struct_to_json(config, xl_model_fields()); }

json to_json(const XlConfig& config) { return xl_schema().to_json(config); }

XlConfig xl_config_from_json(const json& j, const std::string& origin) { return xl_schema().from_json(j, origin); }

XlConfig load_xl_config(const std::string& path) { return xl_config_from_json(config_detail::read_json_file(path), path); }

void apply_overrides(XlConfig& config, const std::vector<std::string>& overrides) {
  xl_schema().apply_overrides(config, overrides);
}

void validate(const XlConfig& config) {
  validate(config.model);
  const auto& s = config.search;
  if (config.model.search) {
    if (!(s.arch_lr > 0)) fail("config: arch_lr must be positive (got {})", s.arch_lr);
    if (!(s.arch_weight_decay >= 0)) fail("config: arch_weight_decay must be >= 0 (got {})", s.arch_weight_decay);
    if (s.arch_freeze_steps < 0) fail("config: arch_freeze_steps must be >= 0 (got {})", s.arch_freeze_steps);
    if (!(s.tau0 > 0) || !(s.tau1 > 0) || !std::isfinite(s.tau0) || !std::isfinite(s.tau1))
      fail("config: tau0 and tau1 must be positive (got {} and {}); tau = 0 is not a distribution", s.tau0, s.tau1);
  }
  validate(config.train);
}

void check_training_step_fits(const XlConfig& config) {
  // The training segment and the validation's, at their batches.
  const auto& m = config.model;
  if (!step_in_host_memory(config.train)) return;
  check_xl_segment_fits(m, micro_batch(config.train), m.tgt_len, m.mem_len, "tgt_len");
  check_xl_segment_fits(m, static_cast<double>(config.train.eval_batch_size), m.eval_tgt_len > 0 ? m.eval_tgt_len : m.tgt_len,
                        m.eval_mem_len >= 0 ? m.eval_mem_len : m.mem_len, "eval_tgt_len");
}

std::string model_difference(const XlConfig& a, const XlConfig& b) { return xl_schema().model_difference(a, b); }

}  // namespace spanformer
