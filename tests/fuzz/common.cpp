// What every fuzz target shares (tests/fuzz/fuzz.h), and the replay driver of the normal build.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "fuzz.h"

namespace spanformer::fuzz {

const std::string& scratch_dir() {
  static const std::string dir = [] {
    auto path = std::filesystem::temp_directory_path() / ("spanformer-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(path);
    return path.string();
  }();
  return dir;
}

std::string as_file(const uint8_t* data, size_t size, const std::string& suffix) {
  const std::string path = scratch_dir() + "/input" + suffix;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) fuzz_finding(("cannot write " + path).c_str());
  return path;
}

void fuzz_finding(const char* what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

std::map<std::string, Target>& targets() {
  static std::map<std::string, Target> all;
  return all;
}

int register_target(const char* name, Target target) {
  targets()[name] = target;
  return 0;
}

}  // namespace spanformer::fuzz

#ifndef SPANFORMER_LIBFUZZER
// fuzz_replay TARGET FILE|DIR...: runs TARGET on every file given (directories: every file inside, in
// name order); fuzz_replay --list prints the targets. Exit 0 when every input ran.
int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using spanformer::fuzz::targets;
  if (argc >= 2 && std::string(argv[1]) == "--list") {
    for (const auto& [name, target] : targets()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (argc < 3 || !targets().count(argv[1])) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET FILE|DIR... (fuzz_replay --list names the targets)\n");
    return 2;
  }
  const auto target = targets()[argv[1]];
  int ran = 0;
  for (int i = 2; i < argc; ++i) {
    std::vector<fs::path> files;
    if (fs::is_directory(argv[i])) {
      for (const auto& entry : fs::directory_iterator(argv[i]))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
    } else {
      files.emplace_back(argv[i]);
    }
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "fuzz_replay: cannot read %s\n", file.c_str());
        return 1;
      }
      target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++ran;
    }
  }
  std::printf("fuzz_replay %s: %d inputs (%d refused in one line), no finding\n", argv[1], ran, spanformer::fuzz::refusals());
  std::filesystem::remove_all(spanformer::fuzz::scratch_dir());
  return 0;
}
#endif
