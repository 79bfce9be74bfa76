// The GPT config's one home below the engine: its enums' names, the model's invariants (`validate`
// of the model section, which models/gpt check when built), its key table (each key's name, section
// and help, the only place a key's help is written), its train defaults and its schema (JSON in and
// out, overrides, `config keys`, the model section a checkpoint must match). The structs the models
// read are in spanformer/config/gpt_config.h.
#include "spanformer/config/gpt_config.h"

#include "schema.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

namespace spanformer {

constexpr auto kPositionsNames = name_table("positions", std::pair{Positions::kLearned, "learned"},
                                            std::pair{Positions::kSinusoidal, "sinusoidal"});

const char* positions_name(Positions value) { return kPositionsNames.name(value); }

Positions parse_positions(const std::string& name) { return kPositionsNames.parse(name); }

constexpr auto kActivationNames = name_table("activation", std::pair{Activation::kGelu, "gelu"},
                                             std::pair{Activation::kGeluTanh, "gelu_tanh"});

const char* activation_name(Activation value) { return kActivationNames.name(value); }

Activation parse_activation(const std::string& name) { return kActivationNames.parse(name); }

void validate(const GptModelConfig& c) {
  config_detail::require_positive("n_layer", c.n_layer);
  config_detail::require_positive("n_head", c.n_head);
  config_detail::require_positive("d_model", c.d_model);
  config_detail::require_positive("context", c.context);
  if (c.vocab_size < 0) fail("config: vocab_size must be >= 0 (got {})", c.vocab_size);
  if (c.d_inner < 0) fail("config: d_inner must be >= 0 (0 = 4 d_model; got {})", c.d_inner);
  if (c.d_model % c.n_head != 0) fail("config: d_model ({}) must be a multiple of n_head ({})", c.d_model, c.n_head);
  if (c.positions == Positions::kSinusoidal && c.d_model % 2 != 0)
    fail("config: sinusoidal positions need an even d_model (got {})", c.d_model);
  config_detail::require_fraction("dropout", c.dropout);
  config_detail::require_fraction("attn_dropout", c.attn_dropout);
  if (!(c.init_std > 0)) fail("config: init_std must be positive (got {})", c.init_std);
  if (c.window < 1) fail("config: window must be >= 1 (got {})", c.window);
  if (c.attn_span < 0) fail("config: attn_span must be >= 0 (0 = context; got {})", c.attn_span);
  if (c.attn_span > c.context) fail("config: attn_span ({}) cannot exceed the context ({})", c.attn_span, c.context);
  config_detail::require_positive("adapt_span_ramp", c.adapt_span_ramp);
  if (!(c.adapt_span_init >= 0 && c.adapt_span_init <= 1))
    fail("config: adapt_span_init must be in [0, 1] (got {})", c.adapt_span_init);
  if (!(c.adapt_span_loss >= 0)) fail("config: adapt_span_loss must be >= 0 (got {})", c.adapt_span_loss);
  if (c.sparse_stride < 0) fail("config: sparse_stride must be >= 0 (0 = sqrt(context); got {})", c.sparse_stride);
  if (c.attention == attention::CausalKind::kSparseFixed && (c.sparse_summary < 1 || c.sparse_summary > c.stride_l()))
    fail("config: sparse_summary must be in [1, sparse_stride = {}] (got {})", c.stride_l(), c.sparse_summary);
  config_detail::require_positive("ff_chunks", c.ff_chunks);
  config_detail::require_positive("lsh_hashes", c.lsh_hashes);
  config_detail::require_positive("lsh_chunk", c.lsh_chunk);
  if (c.lsh_buckets < 0 || c.lsh_buckets % 2 != 0)
    fail("config: lsh_buckets must be even and >= 2, or 0 (about context / lsh_chunk; got {})", c.lsh_buckets);
  if (c.eval_stride < 0 || c.eval_stride > c.context)
    fail("config: eval_stride must be in [0, context] (0 = context / 2; got {})", c.eval_stride);
  const double H = static_cast<double>(c.d_model), I = static_cast<double>(c.inner_dim());
  check_model_fits(static_cast<double>(c.vocab_size + c.context) * H * (c.tie_weights ? 1 : 2) +
                   static_cast<double>(c.n_layer) * (4 * H * H + 2 * H * I));
  // One window of one sequence: every layer's keys and values, one feed-forward hidden, the logits.
  const double T = static_cast<double>(c.context);
  check_working_memory_fits(T * (2 * static_cast<double>(c.n_layer) * H + I + static_cast<double>(c.vocab_size)),
                            fmt::format("one window of context {} tokens", c.context));
}


TrainConfig gpt_train_defaults() {
  TrainConfig t;
  t.batch_size = 16;
  t.optim = OptimKind::kAdamW;
  t.weight_decay = 0.1;
  t.adam_beta2 = 0.95;
  t.lr = 1e-3;
  t.lr_min = 1e-4;
  t.scheduler = Schedule::kCosine;
  t.lr_warmup = 100;
  t.grad_clip = 1.0;
  t.nb_steps = 5000;
  t.eval_interval = 250;
  t.eval_blocks = 20;
  t.eval_batch_size = 4;
  return t;
}

namespace {

using namespace config_detail;  // the key tables' and schema's parts (fields.h, schema.h)

const std::vector<Field<GptModelConfig>>& gpt_model_fields() {
  using C = GptModelConfig;
  static const std::vector<Field<C>> fields = {
      field("vocab_size", &C::vocab_size, "V; taken from the prepared data when 0"),
      field("n_layer", &C::n_layer, "N, decoder blocks"),
      field("n_head", &C::n_head, "K, attention heads"),
      field("d_model", &C::d_model, "H, a multiple of n_head"),
      field("d_inner", &C::d_inner, "I, feed-forward width (0 = 4 d_model)"),
      field("context", &C::context, "T: tokens per training example, the longest context"),
      enum_field("positions", &C::positions, parse_positions, positions_name,
                                "learned = GPT-2's, sinusoidal = Vaswani et al.'s"),
      enum_field("activation", &C::activation, parse_activation, activation_name,
                                "the feed-forward GELU: gelu = exact (erf), gelu_tanh = GPT-2's tanh approximation"),
      field("tie_weights", &C::tie_weights, "output projection = token embedding"),
      run_key(field("dropout", &C::dropout, "embeddings and each residual branch")),
      run_key(field("attn_dropout", &C::attn_dropout, "attention probabilities")),
      field("init_std", &C::init_std, "N(0, init_std) weights; residual projections / sqrt(2 n_layer)"),
      enum_field("attention", &C::attention, attention::parse_causal_kind, attention::causal_kind_name,
                                "the attention pattern (docs/usage.md: the GPT family)"),
      field("window", &C::window, "window: keys per query, itself included"),
      field("attn_span", &C::attn_span, "adaptive_span: L, the largest span (0 = context)"),
      field("adapt_span_ramp", &C::adapt_span_ramp, "adaptive_span: R, the mask's ramp"),
      field("adapt_span_init", &C::adapt_span_init, "adaptive_span: initial z / L"),
      field("adapt_span_loss", &C::adapt_span_loss, "adaptive_span: span-loss coefficient"),
      field("sparse_stride", &C::sparse_stride, "sparse_*: l, the stride (0 = round(sqrt(context)))"),
      field("sparse_summary", &C::sparse_summary, "sparse_fixed: c, summary keys at the end of every block of l"),
      enum_field("sparse_combine", &C::sparse_combine, attention::parse_sparse_combine,
                                attention::sparse_combine_name, "sparse_*: merged = A1 u A2 in every head, alternating = by layer, per_head = A1 in the first half of the heads, A2 in the rest"),
      run_key(field("lsh_hashes", &C::lsh_hashes, "lsh: R, hashing rounds (may differ at evaluation)")),
      field("lsh_buckets", &C::lsh_buckets, "lsh: buckets, even (0 = about context / lsh_chunk)"),
      field("lsh_chunk", &C::lsh_chunk, "lsh: m, most recent same-bucket keys read per round"),
      run_key(enum_field("attn_impl", &C::attn_impl, attention::parse_attn_impl, attention::attn_impl_name,
                                "plain = one masked T x T product, fused = query tiles over their band; checkpoints load under any")),
      field("reversible", &C::reversible, "reversible residual layers: activations recomputed in backward"),
      run_key(field("ff_chunks", &C::ff_chunks, "feed-forward over this many slices of the positions (1 = whole)")),
      run_key(field("eval_stride", &C::eval_stride, "sliding-window evaluation: tokens scored per window after the first (0 = context / 2)")),
  };
  return fields;
}

}  // namespace

namespace {

const config_detail::Schema<GptConfig>& gpt_schema() {
  static const config_detail::Schema<GptConfig> schema{
      "gpt", "GPT",
      {model_section(&GptConfig::model, gpt_model_fields),
       run_section(&GptConfig::model, gpt_model_fields), train_section(&GptConfig::train)},
      nullptr,
      [](json& model) {  // dense and flash compute the same function with the same weights
        if (model["attention"] == "flash") model["attention"] = "dense";
      }};
  return schema;
}

}  // namespace

std::vector<ConfigKey> gpt_config_keys() { return gpt_schema().keys(); }

json to_json(const GptModelConfig& config) { return struct_to_json(config, gpt_model_fields()); }

json to_json(const GptConfig& config) { return gpt_schema().to_json(config); }

GptConfig gpt_config_from_json(const json& j, const std::string& origin) { return gpt_schema().from_json(j, origin); }

void apply_overrides(GptConfig& config, const std::vector<std::string>& overrides) {
  gpt_schema().apply_overrides(config, overrides);
}

void validate(const GptConfig& config) {
  validate(config.model);
  validate(config.train);
}

void check_training_step_fits(const GptConfig& config) {
  // A training step, batch included (validate's check counts one window of one sequence).
  const auto& m = config.model;
  const double B = micro_batch(config.train), T = static_cast<double>(m.context);
  if (step_in_host_memory(config.train))
    check_working_memory_fits(
      B * T * (static_cast<double>(m.n_layer) * kept_per_token(static_cast<double>(m.d_model), static_cast<double>(m.inner_dim())) +
               2 * static_cast<double>(m.vocab_size)),
      fmt::format("a training step of {:.0f} sequences of {} tokens", B, m.context));
}

std::string model_difference(const GptConfig& a, const GptConfig& b) { return gpt_schema().model_difference(a, b); }

}  // namespace spanformer
