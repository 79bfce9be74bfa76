// A CPU model of the CUDA execution model, enough to run spanformer's own kernels (src/ops/cuda/*.cu)
// and their LibTorch glue on CPU tensors in the CPU test suite (tests/test_cuda_emulated.cpp). The
// kernels are compiled unchanged as C++ with SPANFORMER_CUDA_EMULATE defined: params.h and device.cuh
// then include this header instead of CUDA's, and launches go through SPANFORMER_LAUNCH.
//
// Why: GPU time is short (minutes now and then), and a kernel that was never run
// fails there on indexing, barriers and fragment layouts rather than on speed. Here every CI run holds
// the kernels to the double-precision reference, so the GPU minutes go to measuring.
//
// What it models
//   - A grid is run one block after another. In a block every CUDA thread is a fiber (Boost.Context)
//     on the calling OS thread; a fiber runs until it reaches a barrier, and the warps run one at a time,
//     each as far as it goes before the next starts (ascending after every other __syncthreads,
//     descending after the rest), so that a read or a refill that a missing __syncthreads leaves
//     unordered comes out in the order that breaks it:
//       __syncthreads()           every live thread of the block (exited threads count as arrived),
//       warp collectives          __syncwarp, __shfl*_sync, __any/__all/__ballot_sync, mma.sync, ldmatrix: the
//                                 lanes named in the mask, which must all name the same mask.
//     A barrier is released when every thread it names waits there. A warp collective's results are
//     computed at release from every lane's operands, i.e. in lockstep, as the hardware does.
//   - Errors that the hardware would turn into a hang or undefined values fail the launch with a one-line
//     message (cudaGetLastError / cudaGetErrorString): a deadlock (a __syncthreads some threads never
//     reach while others wait at a warp op, lanes of one mask at different warp ops), a lane that exited
//     before a warp op naming it, a shuffle reading a lane outside its mask, an ldmatrix row that is not
//     16-byte aligned or not in the block's dynamic shared memory, a cp.async misaligned, into anything
//     but dynamic shared memory or from shared memory, a thread that exits with cp.async copies it never
//     waited for, launch limits (1024 threads
//     a block, 48 KiB of dynamic shared memory unless raised by cudaFuncSetAttribute, 227 KiB at most).
//   - Dynamic shared memory is filled with NaN bytes (0xFF) at each block's start, so a read of an
//     element no thread wrote shows up as NaN. cp.async copies are asynchronous at their latest: each
//     lands when its thread waits for its group, and its destination is NaN from the issue until then. Static __shared__ arrays are function-local statics:
//     blocks run one after another, so one copy serves every block (not poisoned).
//   - Global memory is the host memory the pointers name; atomics are plain read-modify-writes (fibers
//     switch only at barriers, so they are atomic).
// What it does not model: timing, coalescing, bank conflicts, concurrently running blocks (so no
// inter-block races), the fast-math intrinsics' precision (__expf is expf here), out-of-bounds global
// accesses (run the test under AddressSanitizer for those).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

// ---- Runtime API: the types and calls the launchers and the glue use ----------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace spanformer::cuda_emulator {

// What a running CUDA thread sees of itself (threadIdx, blockIdx, blockDim, gridDim).
struct ThreadInfo {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
  int lane;
};

ThreadInfo& current();                 // the running CUDA thread; fails outside a launch
unsigned char* dynamic_shared();       // the running block's dynamic shared memory
bool in_dynamic_shared(const void* p, size_t bytes);  // [p, p + bytes) lies in it (called in a warp op's combine)

// Warp collectives: every lane of `mask` posts `operand`; when all have (with the same mask and the same
// combine), combine(operands, mask) runs once with operands[l] for each lane l of the mask (nullptr
// outside it) and writes each lane's results into its operand; then the lanes go on.
using Combine = void (*)(void* const* operands, unsigned mask);
void warp_collective(unsigned mask, Combine combine, void* operand);
void block_barrier();

// cp.async.{ca,cg}.shared.global (sm_80+): the calling thread copies `bytes` (4, 8 or 16) of global memory
// into dynamic shared memory, the first `src_bytes` from `src` and zeros after them (both addresses aligned
// to `bytes`). The copy lands when the thread waits for its group, and until then the destination holds
// NaN bytes: a read before the wait (or, by another thread, before a barrier after it) shows up as NaN,
// and an issue into a buffer other threads still read poisons what they read.
void cp_async(void* dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();            // cp.async.commit_group: the thread's uncommitted copies form a group
void cp_async_wait(int pending);   // cp.async.wait_group N: all but the N most recent groups have landed
[[noreturn]] void fail(const char* message);  // fails the running launch with this message

// Runs body() as every thread of every block of the grid; the launch's error, if any, becomes the next
// cudaGetLastError().
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*), void* context);
void set_max_dynamic_shared(const void* kernel, int bytes);

// Every launch's kernel (its function's address), in order, since the last clear: which kernels a call
// of the glue ran (tests/test_cuda_emulated.cpp holds each lab variant to launching a kernel of its own).
std::vector<const void*> launched_kernels();
void clear_launched_kernels();

// kernel<<<grid, block, shared, stream>>>(args...) as launch_of(kernel, grid, block, shared)(args...).
template <class... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared;
  template <class... A>
  void operator()(A&&... args) const {
    struct Context {
      void (*kernel)(P...);
      std::tuple<P...> params;  // by value, as CUDA copies a kernel's parameters
    } context{kernel, std::tuple<P...>(std::forward<A>(args)...)};
    run_grid(reinterpret_cast<const void*>(kernel), grid, block, shared,
             [](void* c) {
               auto* ctx = static_cast<Context*>(c);
               std::apply(ctx->kernel, ctx->params);
             },
             &context);
  }
};
template <class... P>
Launch<P...> launch_of(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared) {
  return Launch<P...>{kernel, grid, block, shared};
}

}  // namespace spanformer::cuda_emulator

cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);
template <class F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute, int value) {
  spanformer::cuda_emulator::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
  return cudaSuccess;
}
