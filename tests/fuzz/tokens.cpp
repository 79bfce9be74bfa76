// Token files: a prepared split (train.bin: header + ids) and a headerless file of one-byte ids
// (`eval --ids`), every id read once (the readers check them against the vocabulary).
#include "fuzz.h"
#include "spanformer/data/corpus.h"

SPANFORMER_FUZZ_TARGET(tokens) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".bin");
  return spanformer::fuzz::expect_refusal([&] {
    int64_t sum = 0;
    try {
      spanformer::data::TokenFile split(path);
      for (int64_t i = 0; i < split.size(); ++i) sum += split.at(i);
    } catch (const spanformer::Error&) {
    }
    spanformer::data::TokenFile raw(path, spanformer::data::TokenFile::RawBytes{}, 200);
    for (int64_t i = 0; i < raw.size(); ++i) sum += raw.at(i);
    if (sum < 0) spanformer::fuzz::fuzz_finding("a negative token id");
  });
}
