// spanformer, the launcher: make sure this user's dynamic loader will take the LibTorch the program was
// built against, then run the program (spanformer-bin, beside this file's executable).
//
// Why a second executable: LibTorch is found by the dynamic loader before any code of the program runs.
// When the directory the build recorded cannot be read (a checkout under another user's 0700 home), or
// LD_LIBRARY_PATH names a directory holding another libtorch_cpu first, the loader silently takes
// whatever library of that name it finds (Debian's /usr/lib one, a second virtual environment's) and
// the program dies in the loader: "symbol lookup error: undefined symbol: ...", exit 127, no word on
// why. This launcher links nothing but the C library, checks the three ways that happens and says which
// in one line:
//   1. the recorded libtorch_cpu cannot be opened by this user (permission, removed virtual environment);
//   2. the torch package there is another version than the one built against (PyPI's torch keeps its
//      version in torch/version.py, beside lib/; Debian's LibTorch carries it in its file name instead);
//   3. an LD_LIBRARY_PATH entry holds a library of the same name that is another build (another file of
//      another size: a copy of the same library, another virtual environment's same torch, loads fine).
// It also sets GOMP_SPINCOUNT as cli/main.cpp would (so the program need not re-execute itself).
// Wheels (pip install) have no launcher: their program finds LibTorch in the torch package beside it.
//
// Compiled in by CMakeLists.txt: SPANFORMER_LAUNCH_TORCH_DIR (the directory the program loads
// libtorch_cpu from), SPANFORMER_LAUNCH_TORCH_SONAME (the name it asks for), SPANFORMER_LAUNCH_TORCH_VERSION
// (the version built against), SPANFORMER_LAUNCH_PROGRAM (the program's file name, beside the launcher).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "spanformer: error: %s\n", message.c_str());
  std::exit(1);
}

std::string real_path(const std::string& path) {
  char buffer[PATH_MAX];
  return ::realpath(path.c_str(), buffer) != nullptr ? std::string(buffer) : std::string();
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

long long file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

// "2.15.0+cu132" -> "2.15.0": the local part names the wheel's CUDA, not the LibTorch interface.
std::string public_version(const std::string& v) { return v.substr(0, v.find('+')); }

// The version a PyPI torch package declares in torch/version.py (lib/ is beside it); "" where there is
// no such file (Debian's LibTorch, a LibTorch zip).
std::string package_version(const std::string& torch_dir) {
  std::ifstream in(directory_of(torch_dir) + "/version.py");
  std::string line;
  while (std::getline(in, line)) {
    const std::string key = "__version__ = ";
    if (line.rfind(key, 0) != 0 || line.size() < key.size() + 2) continue;
    const char quote = line[key.size()];
    const auto end = line.find(quote, key.size() + 1);
    if (end != std::string::npos) return line.substr(key.size() + 1, end - key.size() - 1);
  }
  return "";
}

void check_torch() {
  const std::string dir = SPANFORMER_LAUNCH_TORCH_DIR, soname = SPANFORMER_LAUNCH_TORCH_SONAME;
  const std::string library = dir + "/" + soname;
  // Opened, not access()ed: root without its override capabilities is refused by open() as the loader is.
  const int fd = ::open(library.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fail("cannot read LibTorch at " + library + ": " + std::strerror(errno) +
         " (this build loads it from there: run it as a user who can read that directory, or rebuild "
         "with bash scripts/build.sh)");
  }
  ::close(fd);
  const std::string built = public_version(SPANFORMER_LAUNCH_TORCH_VERSION);
  const std::string there = public_version(package_version(dir));
  if (!there.empty() && !built.empty() && there != built) {
    fail("this build was made for LibTorch " + built + ", but " + directory_of(dir) + " now holds torch " +
         there + ": rebuild (bash scripts/build.sh)");
  }
  const std::string ours = real_path(library);
  const char* search = std::getenv("LD_LIBRARY_PATH");
  std::stringstream entries(search != nullptr ? search : "");
  std::string entry;
  while (std::getline(entries, entry, ':')) {
    if (entry.empty()) continue;
    const std::string other = real_path(entry + "/" + soname);
    if (!other.empty() && other != ours && file_size(other) != file_size(ours)) {
      fail("LD_LIBRARY_PATH's " + entry + " holds another LibTorch (" + soname +
           "), which the loader would take before this build's in " + dir + ": remove it from LD_LIBRARY_PATH");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  check_torch();
  const std::string self = real_path("/proc/self/exe");
  if (self.empty()) fail(std::string("cannot find this launcher's own file: ") + std::strerror(errno));
  const std::string program = directory_of(self) + "/" + SPANFORMER_LAUNCH_PROGRAM;
  // OpenMP's spinning slows OpenBLAS on small machines (cli/main.cpp says more): the same default.
  if (!std::getenv("GOMP_SPINCOUNT") && !std::getenv("OMP_WAIT_POLICY")) ::setenv("GOMP_SPINCOUNT", "10000", 1);
  ::execv(program.c_str(), argv);
  fail("cannot run " + program + ": " + std::strerror(errno));
}
