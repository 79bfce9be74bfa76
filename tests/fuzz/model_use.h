// Opening a checkpoint as the commands do and running the model a little (fuzz targets).
#pragma once
#include <string>

#include "spanformer/train/checkpoint.h"
#include "spanformer/train/family.h"

namespace spanformer::fuzz {

inline void use_checkpoint(const std::string& path) {
  train::Checkpoint ck(path);
  auto family = train::family_from_checkpoint(ck);
  family->module().eval();
  train::SampleRequest request;
  request.prompt = "a";
  request.tokens = 2;
  request.on_text = [](const std::string&) {};
  auto* sampling = family->as<train::Sampling>();
  if (!sampling) return;
  try {
    sampling->sample(ck.vocab(), request);
  } catch (const Error&) {  // a refusal (non-finite logits of fuzzed weights ...) is one line
  }
}

}  // namespace spanformer::fuzz
