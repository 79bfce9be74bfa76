// Transformer-XL's reference state_dict (kimiyoung/transformer-xl's MemTransformerLM) as `import
// transformer-xl` reads it into scripts/fuzz.sh's tiny XL config (model_use.h).
#include "fuzz.h"
#include "model_use.h"

SPANFORMER_FUZZ_TARGET(xl_reference) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".pt");
  return spanformer::fuzz::expect_refusal([&] {
    spanformer::fuzz::use_reference("transformer-xl", path,
                                    R"({"arch": "xl", "model": {"n_layer": 1, "d_model": 8, "n_head": 2, "d_head": 4,
                                        "d_inner": 16, "tgt_len": 8, "mem_len": 8}})");
  });
}
