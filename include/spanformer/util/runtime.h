// Process-level helpers: thread count, peak memory, Ctrl-C, wall clock.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace spanformer {

// Sets LibTorch's intra-op thread count; 0 means "all cores". Returns the count in use.
int set_threads(int threads);

// Peak resident set size of this process in bytes.
int64_t peak_rss_bytes();

// Ctrl-C handling: after install_interrupt_handler(), SIGINT/SIGTERM set a flag that long loops poll
// (so a training run can save a checkpoint before it exits). A second Ctrl-C exits at once.
void install_interrupt_handler();
bool interrupted();

// Seconds since an arbitrary fixed point (monotonic).
double now_seconds();

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace spanformer
