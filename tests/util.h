// Shared helpers for the test suite: temporary directories and small real corpora.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "spanformer/data/corpus.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::tu {

inline std::string shared_dir() { return SPANFORMER_SHARED_DIR; }

// A fresh directory under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("spanformer-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

// The message of the spanformer::Error that f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The first `bytes` of Dickens, prepared (CRLF -> LF, 90/5/5) into dir.
inline void prepare_dickens_slice(const std::string& dir, int64_t bytes) {
  std::ifstream in(shared_dir() + "/data/dickens.txt", std::ios::binary);
  ASSERT_TRUE(in) << "missing ../shared/data/dickens.txt";
  std::string text(static_cast<size_t>(bytes), '\0');
  in.read(text.data(), bytes);
  write_text(dir + "/slice.txt", text);
  data::PrepareOptions options;
  options.crlf_to_lf = true;
  data::prepare_bytes(dir + "/slice.txt", dir, options);
}

}  // namespace spanformer::tu
