// What a language model's loss is reported in, converted from nats per token (the loss every family
// computes): bits per character for byte vocabularies (nll / ln 2), perplexity for word ones (e^nll),
// or the nats themselves for example data (beside the accuracy or BLEU).
#pragma once
#include <string>

namespace spanformer::metrics {

enum class Unit { kBpc, kPpl, kNats };
const char* unit_name(Unit unit);
Unit parse_unit(const std::string& name);  // fails "unit must be bpc, ppl or nats (got 'x')"
double in_unit(double nll, Unit unit);     // nll in nats per token

}  // namespace spanformer::metrics
