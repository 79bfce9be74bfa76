#include "spanformer/util/runtime.h"

#include <malloc.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <thread>

#include <fmt/format.h>
#ifdef SPANFORMER_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace spanformer {

int threads_from_environment() {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  return omp ? std::max(0, std::atoi(omp)) : 0;
}

int set_threads(int threads) {
  if (threads <= 0) threads = threads_from_environment();
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  return threads;
}

// VmHWM of /proc/self/status: this program's own high-water mark. getrusage's ru_maxrss is not: Linux
// carries the launching process's resident size across fork and exec into it, so a run started from a
// 2 GB Python process (a benchmark script, a notebook) reported 2 GB whatever it used itself.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string peak_memory_text(bool cuda) {
  std::string text = fmt::format("peak RSS {:.0f} MB", static_cast<double>(peak_rss_bytes()) / 1e6);
#ifdef SPANFORMER_WITH_CUDA
  if (cuda) {
    // Index 0 of the allocator's statistics is the aggregate over pool types (every LibTorch version).
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    text += fmt::format(", peak CUDA memory {:.0f} MB", static_cast<double>(stats.allocated_bytes[0].peak) / 1e6);
  }
#endif
  return text;
}

namespace {
std::atomic<int> g_interrupts{0};
void on_signal(int) {
  if (g_interrupts.fetch_add(1) >= 1) _exit(130);
  const char msg[] = "\nspanformer: interrupted, saving a checkpoint (Ctrl-C again to quit now)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
}
}  // namespace

void install_interrupt_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGHUP, on_signal);  // a closed terminal: stop and checkpoint like SIGTERM
}

bool interrupted() { return g_interrupts.load() > 0; }

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

void keep_freed_memory() {
  if (std::getenv("GLIBC_TUNABLES") || std::getenv("MALLOC_MMAP_MAX_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return;
  mallopt(M_MMAP_MAX, 0);                // large blocks from the heap, reused after free
  // Never shrink the heap. mallopt takes an int, but glibc stores the threshold as a size_t, so -1 is
  // "no threshold"; INT_MAX (2 GiB) was not enough: a step whose transient tensors exceed 2 GiB handed
  // them back and faulted them in again each step (sparse_fixed at 16k tokens: 10.8 -> 4.1 s per step).
  mallopt(M_TRIM_THRESHOLD, -1);
}

}  // namespace spanformer
