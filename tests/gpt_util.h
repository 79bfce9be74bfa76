// The GPT family's smallest model for tests: 2 layers x 2 heads, H 8, 11 tokens, no dropout, every
// attention's settings small enough that tiles, windows, spans, sparse blocks and LSH chunks all split.
#pragma once
#include "spanformer/config/gpt_config.h"

namespace spanformer::tu {

inline GptConfig tiny_gpt(attention::CausalKind kind, int64_t T = 24) {
  GptConfig c;
  auto& m = c.model;
  m.vocab_size = 11;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 8;
  m.context = T;
  m.dropout = 0;
  m.attention = kind;
  m.window = 5;
  m.adapt_span_ramp = 4;
  m.adapt_span_init = 0.2;
  m.sparse_stride = 5;
  m.sparse_summary = 2;
  m.sparse_combine = attention::SparseCombine::kPerHead;
  m.lsh_chunk = 4;
  return c;
}

}  // namespace spanformer::tu
