// The attention choices a config names, as enums with one name table each (defined beside the code that
// runs them: attention/causal_attention.cpp, attention/scoring.cpp, attention/attn_impl.cpp). Torch-free,
// so that the config headers (config/*.h) name a choice without pulling in the attention code:
//   AttnImpl       how a layer computes its attention: auto | fused | plain (attn_impl.h, with the auto rules)
//   CausalKind     the GPT family's drop-in causal attentions (causal_attention.h has each one's formula)
//   SparseCombine  how the Sparse Transformer's two patterns combine over heads and layers
//   ScoreKind      the scoring function of textbook attention (scoring.h)
// Each parse_* fails with a one-line error naming the value and the choices.
#pragma once
#include <string>

#include "spanformer/attention/attn_impl.h"

namespace spanformer::attention {

enum class CausalKind { kDense, kFlash, kWindow, kAdaptiveSpan, kSparseStrided, kSparseFixed, kLsh };
const char* causal_kind_name(CausalKind kind);
CausalKind parse_causal_kind(const std::string& name);

enum class SparseCombine { kMerged, kAlternating, kPerHead };
const char* sparse_combine_name(SparseCombine c);
SparseCombine parse_sparse_combine(const std::string& name);

enum class ScoreKind { kAdditive, kDot, kScaledDot, kGeneral };
const char* score_kind_name(ScoreKind kind);
ScoreKind parse_score_kind(const std::string& name);

}  // namespace spanformer::attention
