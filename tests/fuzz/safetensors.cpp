// A safetensors file as `import safetensors` reads it: validated, the family built from its metadata,
// every weight loaded and checked, the checkpoint written and opened again, and two tokens sampled
// (language models).
#include "fuzz.h"
#include "model_use.h"
#include "spanformer/train/formats.h"

SPANFORMER_FUZZ_TARGET(safetensors) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".safetensors");
  return spanformer::fuzz::expect_refusal([&] {
    const std::string out = spanformer::fuzz::scratch_dir() + "/imported.pt";
    spanformer::train::import_safetensors(path, out);
    spanformer::fuzz::use_checkpoint(out);
  });
}
