// The Transformer-XL/PAR config's one home below the engine: its enums' names, the model's invariants (`validate`
// of the model section, which models/xl and models/par check when built), its key table (each key's name, section
// and help, the only place a key's help is written), its train defaults and its schema (JSON in and
// out, overrides, `config keys`, the model section a checkpoint must match). The structs the models
// read are in spanformer/config/xl_config.h.
#include "spanformer/config/xl_config.h"

#include <algorithm>
#include <cmath>

#include "schema.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

namespace spanformer {

constexpr auto kSearchEvalNames = name_table("search_eval", std::pair{SearchEval::kSoftmax, "softmax"},
                                             std::pair{SearchEval::kArgmax, "argmax"});

const char* search_eval_name(SearchEval value) { return kSearchEvalNames.name(value); }

SearchEval parse_search_eval(const std::string& name) { return kSearchEvalNames.parse(name); }

constexpr auto kTauScheduleNames = name_table("tau_schedule", std::pair{TauSchedule::kExp, "exp"},
                                              std::pair{TauSchedule::kLinear, "linear"},
                                              std::pair{TauSchedule::kConstant, "constant"});

const char* tau_schedule_name(TauSchedule value) { return kTauScheduleNames.name(value); }

TauSchedule parse_tau_schedule(const std::string& name) { return kTauScheduleNames.parse(name); }

char block_letter(BlockKind kind) {
  switch (kind) {
    case BlockKind::kAttention: return 'a';
    case BlockKind::kFeedForward: return 'f';
    case BlockKind::kSearch: return 's';
  }
  return '?';
}

std::string blocks_text(const std::vector<BlockKind>& blocks) {
  std::string s;
  for (auto b : blocks) s += block_letter(b);
  return s;
}

std::vector<BlockKind> XlModelConfig::blocks() const {
  if (search) return std::vector<BlockKind>(static_cast<size_t>(2 * std::max<int64_t>(n_layer, 0)), BlockKind::kSearch);
  std::vector<BlockKind> out;
  if (layers.empty())
    for (int64_t i = 0; i < n_layer; ++i) out.insert(out.end(), {BlockKind::kAttention, BlockKind::kFeedForward});
  for (char ch : layers) out.push_back(ch == 'a' ? BlockKind::kAttention : BlockKind::kFeedForward);  // validated: a | f
  return out;
}

int64_t XlModelConfig::nb_blocks() const { return static_cast<int64_t>(blocks().size()); }

void validate(const XlModelConfig& c) {
  config_detail::require_positive("d_model", c.d_model);
  config_detail::require_positive("n_head", c.n_head);
  config_detail::require_positive("d_head", c.d_head);
  config_detail::require_positive("d_inner", c.d_inner);
  config_detail::require_positive("tgt_len", c.tgt_len);
  if (c.vocab_size < 0) fail("config: vocab_size must be >= 0 (got {})", c.vocab_size);
  if (c.d_embed < 0) fail("config: d_embed must be >= 0 (got {})", c.d_embed);
  if (c.mem_len < 0) fail("config: mem_len must be >= 0 (got {})", c.mem_len);
  if (c.ext_len < 0) fail("config: ext_len must be >= 0 (got {})", c.ext_len);
  if (c.clamp_len < -1) fail("config: clamp_len must be >= 0 (0 or -1: no clamp; got {})", c.clamp_len);
  config_detail::require_fraction("dropout", c.dropout);
  config_detail::require_fraction("dropatt", c.dropatt);
  if (!(c.init_std > 0) || !(c.proj_init_std > 0)) fail("config: init_std and proj_init_std must be positive");
  if (c.search) {
    config_detail::require_positive("n_layer", c.n_layer);
    if (!c.layers.empty()) fail("config: a super-network (search: true) has 2 x n_layer mixed blocks; leave 'layers' empty");
  } else if (c.layers.empty()) {
    config_detail::require_positive("n_layer", c.n_layer);
  } else {
    for (size_t i = 0; i < c.layers.size(); ++i) {
      const char ch = c.layers[i];
      if (ch != 'a' && ch != 'f')
        fail("config: layers \"{}\": unknown block '{}' at position {} (a = attention, f = feed-forward)", c.layers,
             std::string(1, ch), i);
    }
  }
  if (c.eval_tgt_len < 0) fail("config: eval_tgt_len must be >= 0 (got {})", c.eval_tgt_len);
  if (c.eval_mem_len < -1) fail("config: eval_mem_len must be >= 0 (-1: mem_len; got {})", c.eval_mem_len);
  if (c.eval_clamp_len < -1) fail("config: eval_clamp_len must be >= 0 (-1: clamp_len; got {})", c.eval_clamp_len);
  if (c.adaptive) {
    if (c.div_val < 1) fail("config: div_val must be >= 1 (got {})", c.div_val);
    for (size_t i = 0; i < c.cutoffs.size(); ++i) {
      if (c.cutoffs[i] <= 0) fail("config: cutoffs must be positive (got {} at position {})", c.cutoffs[i], i);
      if (i > 0 && c.cutoffs[i] <= c.cutoffs[i - 1])
        fail("config: cutoffs must be strictly increasing (got {} after {})", c.cutoffs[i], c.cutoffs[i - 1]);
      if (c.vocab_size > 0 && c.cutoffs[i] >= c.vocab_size)
        fail("config: cutoff {} is out of range: it must be below the vocabulary size {}", c.cutoffs[i], c.vocab_size);
    }
    int64_t width = c.embed_dim();
    for (size_t i = 0; i <= c.cutoffs.size(); ++i) {
      if (width < 1) fail("config: d_embed {} / div_val^{} is below 1: fewer clusters or a smaller div_val", c.embed_dim(), i);
      width /= c.div_val;
    }
  }
  if (c.adapt_span) {
    config_detail::require_positive("adapt_span_ramp", c.adapt_span_ramp);
    if (c.attn_span < 0) fail("config: attn_span must be >= 0 (got {})", c.attn_span);
    if (!(c.adapt_span_init >= 0 && c.adapt_span_init <= 1))
      fail("config: adapt_span_init must be in [0, 1] (got {})", c.adapt_span_init);
    if (!(c.adapt_span_loss >= 0)) fail("config: adapt_span_loss must be >= 0 (got {})", c.adapt_span_loss);
    if (c.ext_len > 0) fail("config: ext_len > 0 with adapt_span is not supported (memories follow the spans)");
  }
  const double H = static_cast<double>(c.d_model), KD = static_cast<double>(c.n_head) * static_cast<double>(c.d_head);
  check_model_fits(2 * static_cast<double>(c.vocab_size) * static_cast<double>(c.embed_dim()) +
                   static_cast<double>(c.nb_blocks()) * (2 * KD * H + H * static_cast<double>(c.d_inner)));  // a or f
  check_xl_segment_fits(c, 1, c.tgt_len, c.mem_len, "tgt_len");
  check_xl_segment_fits(c, 1, c.eval_tgt_len > 0 ? c.eval_tgt_len : c.tgt_len,
                        c.eval_mem_len >= 0 ? c.eval_mem_len : c.mem_len, "eval_tgt_len");
}

void check_xl_segment_fits(const XlModelConfig& c, double batch, int64_t tgt, int64_t mem, const std::string& names) {
  // A segment of `batch` sequences: a layer's scores over the segment and its memory, every block's
  // states (the next memories), the logits.
  const double t = static_cast<double>(tgt), m = static_cast<double>(mem), H = static_cast<double>(c.d_model);
  check_working_memory_fits(batch * t * (static_cast<double>(c.n_head) * (t + m) + static_cast<double>(c.nb_blocks()) * H +
                                         static_cast<double>(c.vocab_size)),
                            batch == 1 ? fmt::format("a segment of {} {} tokens with {} of memory", names, tgt, mem)
                                       : fmt::format("a segment of {:.0f} sequences of {} {} tokens with {} of memory",
                                                     batch, names, tgt, mem));
}


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

using namespace config_detail;  // the key tables' and schema's parts (fields.h, schema.h)

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
      run_key(enum_field("search_eval", &C::search_eval, parse_search_eval, search_eval_name, "weights without noise at evaluation")),
      field("adapt_span", &C::adapt_span, "adaptive span (Sukhbaatar et al. 2019) inside every attention block"),
      field("attn_span", &C::attn_span, "L, the largest span (0 = mem_len + tgt_len)"),         field("adapt_span_ramp", &C::adapt_span_ramp, "R"),
      field("adapt_span_init", &C::adapt_span_init, "initial z / L"), field("adapt_span_loss", &C::adapt_span_loss, "span-loss coefficient"),
      run_key(enum_field("attn_impl", &C::attn_impl, attention::parse_attn_impl, attention::attn_impl_name,
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
      enum_field("tau_schedule", &C::tau_schedule, parse_tau_schedule, tau_schedule_name, "the Gumbel-softmax temperature from tau0 to tau1"),
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
      {model_section(&XlConfig::model, xl_model_fields),
       run_section(&XlConfig::model, xl_model_fields),
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
