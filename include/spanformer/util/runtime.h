// Process-level helpers: thread count, peak memory, Ctrl-C, wall clock.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace spanformer {

// Sets LibTorch's intra-op thread count; 0 means OMP_NUM_THREADS where that is a positive number (as
// PyTorch's own default), else all cores. Returns the count in use.
int set_threads(int threads);
// OMP_NUM_THREADS where it is a positive number, else 0.
int threads_from_environment();

// Keeps freed memory in the process for reuse instead of handing it back to the kernel (glibc malloc:
// no mmap for large blocks, no trimming). LibTorch on CPU frees and reallocates the same large
// tensors every step; returned to the kernel, each reallocation faults its pages in again. Measured on
// the 2-core EPYC machine (docs/benchmarks.md): bench_small at span 540, eval 410 -> 242 ms/step,
// training 1056 -> 805 ms/step. Call once at start-up, before any thread starts; the user's own
// GLIBC_TUNABLES / MALLOC_* settings win.
void keep_freed_memory();

// Peak resident set size of this process in bytes.
int64_t peak_rss_bytes();
// "peak RSS N MB", and on a CUDA device also the caching allocator's peak of allocated bytes.
std::string peak_memory_text(bool cuda);

// Ctrl-C handling: after install_interrupt_handler(), SIGINT/SIGTERM/SIGHUP set a flag that long loops poll
// (so a training run can save a checkpoint before it exits). A second Ctrl-C exits at once.
void install_interrupt_handler();
bool interrupted();

// Seconds since an arbitrary fixed point (monotonic).
double now_seconds();

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace spanformer
