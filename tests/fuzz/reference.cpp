// The adaptive-span reference's state_dict (torch.save of model.state_dict(), as its training script
// writes it) as `import adaptive-span` reads it into scripts/fuzz.sh's tiny config (model_use.h).
#include "fuzz.h"
#include "model_use.h"

SPANFORMER_FUZZ_TARGET(reference) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".pt");
  return spanformer::fuzz::expect_refusal([&] {
    spanformer::fuzz::use_reference("adaptive-span", path,
                                    R"({"model": {"nb_layers": 1, "hidden_size": 8, "inner_hidden_size": 16, "nb_heads": 2,
                                        "attn_span": 16, "block_size": 8}})");
  });
}
