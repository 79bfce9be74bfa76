// The Transformer-XL/PAR config's enums and the model's invariants (`validate` of the model section), which
// models/xl and models/par check when built. The family's key table, train defaults and schema are in
// src/train/families/xl/config.cpp.
#include "spanformer/config/xl_config.h"

#include <algorithm>
#include <cmath>

#include "fields.h"
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

}  // namespace spanformer
