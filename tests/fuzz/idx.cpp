// An IDX file (MNIST / Fashion-MNIST images and labels, `data` for the ViT family).
#include "fuzz.h"
#include "spanformer/data/idx.h"

SPANFORMER_FUZZ_TARGET(idx) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".idx");
  return spanformer::fuzz::expect_refusal([&] { (void)spanformer::data::read_idx(path); });
}
