// Shared by the Transformer-XL / PAR test files: a tiny model config and a double-precision model.
#pragma once
#include <torch/torch.h>

#include "spanformer/config/xl_config.h"
#include "spanformer/models/xl.h"

namespace spanformer::xl_test {

using models::xl::XlModel;

inline XlModelConfig tiny_config() {
  XlModelConfig c;
  c.vocab_size = 50;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 2;
  c.d_head = 8;
  c.d_inner = 24;
  c.dropout = 0.0;
  c.tgt_len = 6;
  c.mem_len = 6;
  c.init_std = 0.3;  // larger than the default so that every term matters in the comparisons
  return c;
}

inline XlModel double_model(const XlModelConfig& c) {
  torch::manual_seed(3);
  XlModel m(c);
  m->to(torch::kDouble);
  m->eval();
  return m;
}

}  // namespace spanformer::xl_test
