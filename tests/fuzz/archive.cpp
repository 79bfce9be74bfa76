// A data-get archive (enwik8.zip, text8.zip, the WikiText zips) as `data get` unpacks it, member by
// name through libzip. `data get` checks an archive's published checksum before unpacking, so this
// target tests the layer below that gate: a damaged or hostile zip must be refused in one line.
#include <filesystem>

#include "fuzz.h"
#include "spanformer/data/download.h"

SPANFORMER_FUZZ_TARGET(archive) {
  const std::string path = spanformer::fuzz::as_file(data, size, ".zip");
  return spanformer::fuzz::expect_refusal([&] {
    const std::string out = spanformer::fuzz::scratch_dir() + "/enwik8";
    spanformer::data::unzip_member(path, "enwik8", out);
    std::filesystem::remove(out);
  });
}
