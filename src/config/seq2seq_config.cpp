// The seq2seq config's one home below the engine: its enums' names, the model's invariants (`validate`
// of the model section, which models/seq2seq check when built), its key table (each key's name, section
// and help, the only place a key's help is written), its train defaults and its schema (JSON in and
// out, overrides, `config keys`, the model section a checkpoint must match). The structs the models
// read are in spanformer/config/seq2seq_config.h.
#include "spanformer/config/seq2seq_config.h"

#include "schema.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

namespace spanformer {

namespace data {
constexpr auto kTokenizerNames = name_table("tokenizer", std::pair{Tokenizer::kWords, "words"},
                                            std::pair{Tokenizer::kSentencePiece, "sentencepiece"});
const char* tokenizer_name(Tokenizer value) { return kTokenizerNames.name(value); }
Tokenizer parse_tokenizer(const std::string& name) { return kTokenizerNames.parse(name); }

constexpr auto kSubwordKindNames = name_table("subword_kind", std::pair{SubwordKind::kUnigram, "unigram"},
                                              std::pair{SubwordKind::kBpe, "bpe"});
const char* subword_kind_name(SubwordKind value) { return kSubwordKindNames.name(value); }
SubwordKind parse_subword_kind(const std::string& name) { return kSubwordKindNames.parse(name); }
}  // namespace data

constexpr auto kSeq2SeqKindNames = name_table("kind", std::pair{Seq2SeqKind::kGru, "gru"},
                                              std::pair{Seq2SeqKind::kBahdanau, "bahdanau"},
                                              std::pair{Seq2SeqKind::kLuong, "luong"},
                                              std::pair{Seq2SeqKind::kTransformer, "transformer"});

const char* seq2seq_kind_name(Seq2SeqKind value) { return kSeq2SeqKindNames.name(value); }

Seq2SeqKind parse_seq2seq_kind(const std::string& name) { return kSeq2SeqKindNames.parse(name); }

void validate(const Seq2SeqModelConfig& c) {
  config_detail::require_positive("d_model", c.d_model);
  config_detail::require_positive("n_layer", c.n_layer);
  config_detail::require_positive("n_head", c.n_head);
  config_detail::require_positive("max_positions", c.max_positions);
  config_detail::require_positive("beam", c.beam);
  if (c.vocab_size < 0 || c.target_vocab < 0 || c.target_vocab > c.vocab_size)
    fail("config: need 0 <= target_vocab <= vocab_size (got {} and {})", c.target_vocab, c.vocab_size);
  if (c.vocab_size > 0 && c.target_vocab <= data::kEosId)
    fail("config: target_vocab must hold the four special tokens (got {})", c.target_vocab);
  if (c.d_inner < 0) fail("config: d_inner must be >= 0 (0 = 4 d_model; got {})", c.d_inner);
  if (c.max_extra < 0) fail("config: max_extra must be >= 0 (got {})", c.max_extra);
  if (c.kind == Seq2SeqKind::kTransformer && c.d_model % c.n_head != 0)
    fail("config: d_model ({}) must be a multiple of n_head ({})", c.d_model, c.n_head);
  if (c.kind == Seq2SeqKind::kTransformer && c.d_model % 2 != 0)
    fail("config: d_model must be even for sinusoidal positions (got {})", c.d_model);
  if (c.deep_output && c.kind != Seq2SeqKind::kBahdanau) fail("config: deep_output is for the bahdanau kind (got {})", seq2seq_kind_name(c.kind));
  if (c.bidirectional && !c.recurrent()) fail("config: bidirectional is for the recurrent kinds (the Transformer's encoder sees both ways)");
  if (c.bidirectional && c.d_model % 2 != 0)
    fail("config: d_model must be even for a bidirectional encoder (H/2 a direction; got {})", c.d_model);
  if (c.kind == Seq2SeqKind::kLuong && c.score != attention::ScoreKind::kDot && c.score != attention::ScoreKind::kGeneral)
    fail("config: luong attention scores with dot or general (got {})", attention::score_kind_name(c.score));
  config_detail::require_fraction("dropout", c.dropout);
  if (!(c.label_smoothing >= 0 && c.label_smoothing < 1))
    fail("config: label_smoothing must be in [0, 1) (got {})", c.label_smoothing);
  if (!(c.length_penalty >= 0 && c.length_penalty <= 10))
    fail("config: length_penalty must be in [0, 10] (got {})", c.length_penalty);
  const double H = static_cast<double>(c.d_model), L = static_cast<double>(c.n_layer);
  const double per_layer = c.recurrent() ? 2 * 3 * 2 * H * H : 2 * (4 * H * H + 2 * H * static_cast<double>(c.inner_dim())) + 4 * H * H;
  check_model_fits(L * per_layer + 3 * static_cast<double>(c.vocab_size) * H);
  check_working_memory_fits(static_cast<double>(c.max_positions) * H,
                            fmt::format("the position table of max_positions {}", c.max_positions));
}


namespace {

using namespace config_detail;  // the key tables' and schema's parts (fields.h, schema.h)

const std::vector<Field<Seq2SeqModelConfig>>& seq2seq_model_fields() {
  using C = Seq2SeqModelConfig;
  static const std::vector<Field<C>> fields = {
      enum_field("kind", &C::kind, parse_seq2seq_kind, seq2seq_kind_name,
                                "the model (gru has no attention)"),
      field("vocab_size", &C::vocab_size, "V, the joint vocabulary; taken from the data when 0"),
      field("target_vocab", &C::target_vocab, "Vt, the decoder's outputs (ids below it); taken from the data when 0"),
      field("d_model", &C::d_model, "H: embeddings and hidden states"),
      field("n_layer", &C::n_layer, "GRU layers, or encoder blocks and decoder blocks each"),
      field("n_head", &C::n_head, "K, attention heads (transformer)"),
      field("d_inner", &C::d_inner, "I, feed-forward width (transformer; 0 = 4 d_model)"),
      run_key(field("dropout", &C::dropout, "embeddings, recurrent layers' outputs, residual branches, attention weights")),
      enum_field("score", &C::score, attention::parse_score_kind, attention::score_kind_name,
                                "the attention score (luong: dot or general)"),
      field("input_feeding", &C::input_feeding, "luong: the previous attentional vector joins the input"),
      field("bidirectional", &C::bidirectional,
            "recurrent kinds: a bidirectional encoder (H/2 a direction, concatenated; Bahdanau et al. 2015)"),
      field("deep_output", &C::deep_output,
            "bahdanau: the paper's output, maxout over U s_{t-1} + V E y_{t-1} + C c_t (false: W_out s_t)"),
      field("pre_norm", &C::pre_norm, "transformer: LayerNorm before each sublayer (false: post-norm, the paper's)"),
      field("share_embeddings", &C::share_embeddings, "one table for source, target and output"),
      run_key(field("max_positions", &C::max_positions, "longest sentence translated (transformer: its sinusoidal table, no weights)")),
      run_key(field("label_smoothing", &C::label_smoothing, "training loss smoothing (the logged NLL is unsmoothed)")),
      run_key(field("beam", &C::beam, "decoding: beam width (1 = greedy)")),
      run_key(field("length_penalty", &C::length_penalty, "decoding: alpha of ((5 + |y|) / 6)^alpha")),
      run_key(field("max_extra", &C::max_extra, "decoding: at most source length + max_extra tokens")),
  };
  return fields;
}

const std::vector<Field<data::PairsOptions>>& data_fields() {
  using C = data::PairsOptions;
  static const std::vector<Field<C>> fields = {
      field("source_column", &C::source_column, "tab-separated field of the source (fra.txt: 1 = French)"),
      field("target_column", &C::target_column, "field of the target (fra.txt: 0 = English)"),
      field("lowercase", &C::lowercase, "lower-case both sides"),
      field("max_length", &C::max_length, "keep pairs of at most this many tokens a side"),
      field("min_freq", &C::min_freq, "training words seen fewer times become <unk> (tokenizer words)"),
      enum_field("tokenizer", &C::tokenizer, data::parse_tokenizer, data::tokenizer_name,
                                "sentencepiece = subwords learned on the training split, both sides"),
      enum_field("subword_kind", &C::subword_kind, data::parse_subword_kind, data::subword_kind_name,
                                "the sentencepiece model's type"),
      field("subword_vocab", &C::subword_vocab, "sentencepiece: vocabulary size, the 4 specials included"),
      field("valid_pairs", &C::valid_pairs, "pairs held out for validation"),
      field("test_pairs", &C::test_pairs, "pairs held out for the test (eval)"),
      field("split_seed", &C::split_seed, "seed of the split's shuffle (independent of train.seed)"),
  };
  return fields;
}

}  // namespace

TrainConfig seq2seq_train_defaults() {
  TrainConfig t;
  t.data = "../shared/data/fra-eng/fra.txt";
  t.batch_size = 128;
  t.optim = OptimKind::kAdam;
  t.adam_beta2 = 0.98;
  t.lr = 1e-3;
  t.scheduler = Schedule::kInverseSqrt;
  t.lr_warmup = 1000;
  t.grad_clip = 1.0;
  t.nb_steps = 10000;
  t.eval_interval = 500;
  t.eval_batch_size = 250;
  return t;
}

namespace {

const config_detail::Schema<Seq2SeqConfig>& seq2seq_schema() {
  static const config_detail::Schema<Seq2SeqConfig> schema{
      "seq2seq",
      "seq2seq",
      {model_section(&Seq2SeqConfig::model, seq2seq_model_fields),
       run_section(&Seq2SeqConfig::model, seq2seq_model_fields),
       config_detail::section("data", &Seq2SeqConfig::data, data_fields), train_section(&Seq2SeqConfig::train)},
      nullptr,
      [](json& model) {  // the scoring function is a Luong model's only
        if (model["kind"] != seq2seq_kind_name(Seq2SeqKind::kLuong)) model.erase("score");
      }};
  return schema;
}

}  // namespace

std::vector<ConfigKey> seq2seq_config_keys() { return seq2seq_schema().keys(); }

json to_json(const Seq2SeqConfig& config) { return seq2seq_schema().to_json(config); }

Seq2SeqConfig seq2seq_config_from_json(const json& j, const std::string& origin) {
  return seq2seq_schema().from_json(j, origin);
}

void apply_overrides(Seq2SeqConfig& config, const std::vector<std::string>& overrides) {
  seq2seq_schema().apply_overrides(config, overrides);
}

void validate(const Seq2SeqConfig& config) {
  validate(config.model);
  validate(config.train);
  if (config.data.tokenizer == data::Tokenizer::kSentencePiece && (config.data.subword_vocab < 16 || config.data.subword_vocab > 1000000))
    fail("config: data.subword_vocab must be in [16, 1000000] (got {})", config.data.subword_vocab);
  if (config.data.max_length + 2 > config.model.max_positions && !config.model.recurrent())
    fail("config: data.max_length + 2 ({}) exceeds model.max_positions ({})", config.data.max_length + 2,
         config.model.max_positions);
}

void check_training_step_fits(const Seq2SeqConfig& config) {
  // A training step: both sides of every pair through every layer (the decoder's cross-attention twice
  // over), the target side's logits.
  const auto& m = config.model;
  const double B = micro_batch(config.train), N = static_cast<double>(config.data.max_length + 2);
  const double H = static_cast<double>(m.d_model);
  if (step_in_host_memory(config.train))
    check_working_memory_fits(B * N * (3 * static_cast<double>(m.n_layer) * kept_per_token(H, static_cast<double>(m.inner_dim())) +
                                     2 * static_cast<double>(m.target_vocab)),
                            fmt::format("a training step of {:.0f} pairs of up to {:.0f} tokens a side", B, N));
}

std::string model_difference(const Seq2SeqConfig& a, const Seq2SeqConfig& b) {
  return seq2seq_schema().model_difference(a, b);
}

}  // namespace spanformer
