// The seq2seq config's enums and the model's invariants (`validate` of the model section), which
// models/seq2seq check when built. The family's key table, train defaults and schema are in
// src/train/families/seq2seq/config.cpp.
#include "spanformer/config/seq2seq_config.h"

#include "spanformer/util/error.h"
#include "spanformer/util/names.h"
#include "fields.h"

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

}  // namespace spanformer
