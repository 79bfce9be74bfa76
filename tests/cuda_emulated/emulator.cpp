// The CPU model of CUDA's execution model (emulator.h says what it models and why): one fiber per CUDA
// thread, a scheduler per block that runs every runnable fiber to its next barrier, then releases the
// barriers whose threads have all arrived. Boost.Context switches in ~12 ns (ucontext's swapcontext
// makes two system calls and took 3.3 us on the 2-core EPYC), which is what makes shuffle-heavy kernels
// affordable here: a warp reduction is five barriers of 32 switches.
#include "emulator.h"

#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace spanformer::cuda_emulator {
namespace {

namespace bc = boost::context;

constexpr int kMaxThreads = 1024;
constexpr size_t kDefaultDynamicShared = 48 * 1024;
constexpr size_t kMaxDynamicShared = 227 * 1024;  // sm_90's opt-in limit per block
constexpr size_t kStackBytes = 128 * 1024;

// The fibers' stacks: Boost.Context's pool, each stack's AddressSanitizer shadow cleared when it is handed
// out and returned. A fiber abandoned after a failed launch unwinds without ASan knowing its stack's
// bounds, which leaves its frames' redzones poisoned; a later fiber on the same memory would then trip on
// them (a false report: stack-buffer-overflow inside ASan's own no-return handler).
struct Stacks {
  bc::pooled_fixedsize_stack* pool;
  bc::stack_context allocate() {
    bc::stack_context c = pool->allocate();
    unpoison(c);
    return c;
  }
  void deallocate(bc::stack_context& c) {
    unpoison(c);
    pool->deallocate(c);
  }
  static void unpoison(const bc::stack_context& c) {
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(c.sp) - c.size, c.size);
#else
    (void)c;
#endif
  }
};

enum class State { kRunnable, kBlockBarrier, kWarpOp, kDone };

struct Thread {
  ThreadInfo info{};
  State state = State::kRunnable;
  bc::fiber self;  // resumes this thread (held by the scheduler while the thread waits)
  bc::fiber back;  // resumes the scheduler (held by the thread while it runs)
  unsigned mask = 0;
  Combine combine = nullptr;
  void* operand = nullptr;
  struct Copy {  // a cp.async not yet landed
    unsigned char* dst;
    const unsigned char* src;
    int bytes, src_bytes;
    long group;  // -1 until committed
  };
  std::vector<Copy> copies;
  long groups = 0;  // groups committed so far
};

// A launch failure raised inside a fiber or the scheduler; the message becomes cudaGetErrorString's.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Block {
  std::vector<Thread> threads;
  std::vector<unsigned char> shared;
  std::string error;  // set by a thread that failed
};

thread_local Thread* running = nullptr;
thread_local Block* block = nullptr;
thread_local cudaError_t last_error = cudaSuccess;
thread_local std::string last_message;
std::map<const void*, size_t>& shared_limits() {
  static std::map<const void*, size_t> limits;
  return limits;
}

Thread& self_thread() {
  if (running == nullptr) throw Failure("a device function was called outside a kernel launch");
  return *running;
}

// Back to the scheduler in `state`; returns when the scheduler resumes this thread.
void wait(State state) {
  Thread& t = self_thread();
  t.state = state;
  t.back = std::move(t.back).resume();
}

const char* state_name(State s) {
  switch (s) {
    case State::kRunnable: return "runnable";
    case State::kBlockBarrier: return "__syncthreads";
    case State::kWarpOp: return "a warp op";
    case State::kDone: return "exited";
  }
  return "?";
}

// One line naming where the block's threads stand, for a deadlock.
std::string describe(const Block& b) {
  std::string out;
  size_t i = 0;
  while (i < b.threads.size()) {
    size_t j = i;
    while (j + 1 < b.threads.size() && b.threads[j + 1].state == b.threads[i].state &&
           b.threads[j + 1].mask == b.threads[i].mask)
      ++j;
    if (!out.empty()) out += ", ";
    out += "threads " + std::to_string(i) + "-" + std::to_string(j) + " " + state_name(b.threads[i].state);
    i = j + 1;
  }
  return out;
}

// Releases warp w's collectives whose lanes have all arrived; true when one was.
bool release_warp_ops(Block& b, size_t w) {
  bool released = false;
  Thread* lanes[32] = {};
  for (int l = 0; l < 32 && w * 32 + l < b.threads.size(); ++l) lanes[l] = &b.threads[w * 32 + l];
  for (int l = 0; l < 32; ++l) {
    if (lanes[l] == nullptr || lanes[l]->state != State::kWarpOp) continue;
    const unsigned mask = lanes[l]->mask;
    const Combine combine = lanes[l]->combine;
    bool ready = true;
    void* operands[32] = {};
    for (int m = 0; m < 32; ++m) {
      if (!(mask >> m & 1u)) continue;
      if (lanes[m] == nullptr || lanes[m]->state == State::kDone)
        throw Failure("warp " + std::to_string(w) + ": lane " + std::to_string(m) +
                      " exited (or does not exist) before a warp op whose mask names it");
      if (lanes[m]->state != State::kWarpOp || lanes[m]->mask != mask || lanes[m]->combine != combine) {
        ready = false;
        break;
      }
      operands[m] = lanes[m]->operand;
    }
    if (!ready) continue;
    combine(operands, mask);
    for (int m = 0; m < 32; ++m)
      if (mask >> m & 1u) lanes[m]->state = State::kRunnable;
    released = true;
  }
  return released;
}

void run_block(Block& b, dim3 grid, dim3 block_dim, uint3 block_idx, void (*body)(void*), void* context,
               Stacks stacks) {
  const unsigned n = block_dim.x * block_dim.y * block_dim.z;
  b.threads.clear();
  b.threads.resize(n);
  b.error.clear();
  std::fill(b.shared.begin(), b.shared.end(), static_cast<unsigned char>(0xff));  // NaN in every float
  for (unsigned id = 0; id < n; ++id) {
    Thread& t = b.threads[id];
    t.info.thread_idx = {id % block_dim.x, (id / block_dim.x) % block_dim.y, id / (block_dim.x * block_dim.y)};
    t.info.block_idx = block_idx;
    t.info.block_dim = block_dim;
    t.info.grid_dim = grid;
    t.info.lane = static_cast<int>(id % 32);
    t.self = bc::fiber(std::allocator_arg, stacks, [&t, &b, body, context](bc::fiber&& back) {
      t.back = std::move(back);
      // A fiber abandoned after a failure unwinds through here by Boost.Context's forced_unwind, which is
      // no std::exception and so passes this handler untouched: catching and rethrowing it would call
      // ASan's no-return handler on a fiber stack it cannot unpoison (a false stack-buffer-overflow).
      try {
        body(context);
      } catch (const std::exception& e) {
        if (b.error.empty()) b.error = e.what();
      }
      if (!t.copies.empty() && b.error.empty())
        b.error = "cp.async: thread " + std::to_string(&t - b.threads.data()) + " exited with " +
                  std::to_string(t.copies.size()) + " copies it never waited for";
      t.state = State::kDone;
      return std::move(t.back);
    });
  }
  // Warp by warp: each warp runs as far as it can (its collectives released as its lanes arrive) before
  // the next one starts, in ascending order after every other __syncthreads and descending after the
  // rest. Warps so drift as far apart as the barriers let them, and a missing barrier shows: a warp
  // reads shared memory another has not written yet (NaN), or refills a buffer another still reads.
  const size_t warps = (n + 31) / 32;
  size_t phase = 0;
  for (;;) {
    bool progress = false;
    for (size_t i = 0; i < warps; ++i) {
      const size_t w = phase % 2 == 0 ? i : warps - 1 - i;
      for (bool moved = true; moved;) {
        moved = false;
        for (size_t id = w * 32; id < std::min<size_t>(n, w * 32 + 32); ++id) {
          Thread& t = b.threads[id];
          if (t.state != State::kRunnable) continue;
          running = &t;
          t.self = std::move(t.self).resume();
          running = nullptr;
          moved = true;
          if (!b.error.empty()) throw Failure(b.error);
        }
        if (release_warp_ops(b, w)) moved = true;
        progress = progress || moved;
      }
    }
    size_t live = 0, at_barrier = 0;
    for (const auto& t : b.threads) {
      live += t.state != State::kDone;
      at_barrier += t.state == State::kBlockBarrier;
    }
    if (live == 0) return;
    if (at_barrier == live) {
      for (auto& t : b.threads)
        if (t.state == State::kBlockBarrier) t.state = State::kRunnable;
      progress = true;
      ++phase;
    }
    if (!progress) throw Failure("deadlock: " + describe(b));
  }
}

}  // namespace

ThreadInfo& current() { return self_thread().info; }

unsigned char* dynamic_shared() {
  self_thread();
  return block->shared.data();
}

bool in_dynamic_shared(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  return c >= block->shared.data() && c + bytes <= block->shared.data() + block->shared.size();
}

void warp_collective(unsigned mask, Combine combine, void* operand) {
  Thread& t = self_thread();
  if (!(mask >> t.info.lane & 1u)) throw Failure("a warp op's mask leaves out the calling lane");
  t.mask = mask;
  t.combine = combine;
  t.operand = operand;
  wait(State::kWarpOp);
}

void block_barrier() { wait(State::kBlockBarrier); }

void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
  Thread& t = self_thread();
  if (bytes != 4 && bytes != 8 && bytes != 16) throw Failure("cp.async copies 4, 8 or 16 bytes");
  if (src_bytes < 0 || src_bytes > bytes) throw Failure("cp.async: src-size outside [0, cp-size]");
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0)
    throw Failure("cp.async: an address is not aligned to the copy's size");
  if (!in_dynamic_shared(dst, bytes)) throw Failure("cp.async: the destination is not in the block's shared memory");
  if (in_dynamic_shared(src, 1)) throw Failure("cp.async: the source is in shared memory, not global");
  auto* d = static_cast<unsigned char*>(dst);
  std::memset(d, 0xff, static_cast<size_t>(bytes));  // NaN until it lands
  t.copies.push_back({d, static_cast<const unsigned char*>(src), bytes, src_bytes, -1});
}

void cp_async_commit() {
  Thread& t = self_thread();
  for (auto& c : t.copies)
    if (c.group < 0) c.group = t.groups;
  ++t.groups;  // an empty group too, as the hardware counts it
}

void cp_async_wait(int pending) {
  Thread& t = self_thread();
  if (pending < 0) throw Failure("cp.async.wait_group: a negative count");
  const long landed = t.groups - pending;  // groups [0, landed) land now
  std::vector<Thread::Copy> rest;
  for (const auto& c : t.copies) {
    if (c.group < 0 || c.group >= landed) {
      rest.push_back(c);
      continue;
    }
    std::memcpy(c.dst, c.src, static_cast<size_t>(c.src_bytes));
    std::memset(c.dst + c.src_bytes, 0, static_cast<size_t>(c.bytes - c.src_bytes));
  }
  t.copies = std::move(rest);
}

void fail(const char* message) { throw Failure(message); }

void set_max_dynamic_shared(const void* kernel, int bytes) { shared_limits()[kernel] = static_cast<size_t>(bytes); }

namespace {
std::mutex launch_log_mutex;
std::vector<const void*>& launch_log() {
  static std::vector<const void*> log;
  return log;
}
}  // namespace

std::vector<const void*> launched_kernels() {
  const std::lock_guard<std::mutex> lock(launch_log_mutex);
  return launch_log();
}

void clear_launched_kernels() {
  const std::lock_guard<std::mutex> lock(launch_log_mutex);
  launch_log().clear();
}

void run_grid(const void* kernel, dim3 grid, dim3 block_dim, size_t shared_bytes, void (*body)(void*),
              void* context) {
  {
    const std::lock_guard<std::mutex> lock(launch_log_mutex);
    launch_log().push_back(kernel);
  }
  const auto reject = [](cudaError_t error, const std::string& message) {
    last_error = error;
    last_message = message;
  };
  const unsigned long threads = static_cast<unsigned long>(block_dim.x) * block_dim.y * block_dim.z;
  if (threads == 0 || threads > kMaxThreads || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535)
    return reject(cudaErrorInvalidConfiguration, "emulated launch: invalid grid or block dimensions");
  const auto limit = shared_limits().count(kernel) ? shared_limits()[kernel] : kDefaultDynamicShared;
  if (shared_bytes > limit || shared_bytes > kMaxDynamicShared)
    return reject(cudaErrorInvalidConfiguration,
                  "emulated launch: " + std::to_string(shared_bytes) + " bytes of dynamic shared memory, limit " +
                      std::to_string(std::min(limit, kMaxDynamicShared)));
  Block b;
  b.shared.resize(shared_bytes);
  bc::pooled_fixedsize_stack pool(kStackBytes);
  const Stacks stacks{&pool};
  block = &b;
  try {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) run_block(b, grid, block_dim, {x, y, z}, body, context, stacks);
  } catch (const Failure& f) {
    block = nullptr;
    reject(cudaErrorLaunchFailure, std::string("emulated launch failed: ") + f.what());
    b.threads.clear();  // unwinds the fibers still waiting
    return;
  }
  block = nullptr;
}

}  // namespace spanformer::cuda_emulator

cudaError_t cudaGetLastError() {
  const auto error = spanformer::cuda_emulator::last_error;
  spanformer::cuda_emulator::last_error = cudaSuccess;
  return error;
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    default: return spanformer::cuda_emulator::last_message.c_str();
  }
}
