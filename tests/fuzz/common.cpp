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
// fuzz_replay TARGET [--expect] FILE|DIR...: runs TARGET on every file given (directories: every file
// inside, in name order). After --expect, each input must have its expected outcome beside it in
// NAME.expect, one line: "accepted", or "refused: <part of the one-line message>"; an input without one,
// or whose outcome differs, fails the replay, and so does an empty corpus (no input at all, or an
// --expect directory with none). fuzz_replay --list prints the targets. Exit 0 when every input ran as
// expected.
namespace {

// The expectation beside an input, or "" when there is none.
std::string expectation_of(const std::filesystem::path& input) {
  std::ifstream in(input.string() + ".expect");
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

// Whether the last input's outcome is the one expected; says why not on stderr.
bool as_expected(const std::filesystem::path& input, const std::string& expected) {
  const std::string& refusal = spanformer::fuzz::last_refusal();
  const std::string got = refusal.empty() ? "accepted" : "refused: " + refusal;
  bool ok = false;
  if (expected == "accepted") ok = refusal.empty();
  else if (expected.rfind("refused: ", 0) == 0) ok = !refusal.empty() && refusal.find(expected.substr(9)) != std::string::npos;
  if (!ok)
    std::fprintf(stderr, "fuzz_replay: %s: expected %s, got %s\n", input.c_str(),
                 expected.empty() ? "an outcome in NAME.expect" : ("'" + expected + "'").c_str(), got.c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using spanformer::fuzz::targets;
  if (argc >= 2 && std::string(argv[1]) == "--list") {
    for (const auto& [name, target] : targets()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (argc < 3 || !targets().count(argv[1])) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET [--expect] FILE|DIR... (fuzz_replay --list names the targets)\n");
    return 2;
  }
  const auto target = targets()[argv[1]];
  int ran = 0, checked = 0, wrong = 0;
  bool expect = false;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--expect") {
      expect = true;
      continue;
    }
    std::vector<fs::path> files;
    if (fs::is_directory(argv[i])) {
      for (const auto& entry : fs::directory_iterator(argv[i]))
        if (entry.is_regular_file() && entry.path().extension() != ".expect") files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        std::fprintf(stderr, "fuzz_replay %s: %s holds no input (an empty corpus replays nothing)\n", argv[1], argv[i]);
        return 1;
      }
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
      if (expect) {
        ++checked;
        if (!as_expected(file, expectation_of(file))) ++wrong;
      }
    }
  }
  std::filesystem::remove_all(spanformer::fuzz::scratch_dir());
  if (ran == 0) {
    std::fprintf(stderr, "fuzz_replay %s: no input ran\n", argv[1]);
    return 1;
  }
  std::printf("fuzz_replay %s: %d inputs (%d refused in one line), %d kept crash inputs as expected%s\n", argv[1], ran,
              spanformer::fuzz::refusals(), checked - wrong, wrong ? "" : ", no finding");
  return wrong ? 1 : 0;
}
#endif
