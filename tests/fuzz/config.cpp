// A config file of any family (`train -c`, `config keys`), read and validated as `train` does before it
// builds anything (building is left out: a valid config may describe a model of many gigabytes).
#include "fuzz.h"
#include "spanformer/train/family.h"

SPANFORMER_FUZZ_TARGET(config) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".json");
  return spanformer::fuzz::expect_refusal([&] {
    auto family = spanformer::train::family_from_config_file(path, {});
    family->set_vocab_size(200, "fuzz");
    family->validate();
    (void)family->config_json().dump();
  });
}
