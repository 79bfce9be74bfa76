// A checkpoint file (zip + pickle + spanformer's manifest), as every command opens it: verified, the
// family built with its weights, two tokens sampled (language models).
#include "fuzz.h"
#include "model_use.h"

SPANFORMER_FUZZ_TARGET(checkpoint) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".pt");
  return spanformer::fuzz::expect_refusal([&] { spanformer::fuzz::use_checkpoint(path); });
}
