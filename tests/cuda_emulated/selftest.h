// Kernels that check the CPU model of CUDA itself (selftest_kernels.cpp): what each computes is known in
// closed form, or the launch must fail. Each returns "" on success, else the launch's error message.
#pragma once
#include <string>
#include <vector>

namespace spanformer::cuda_emulator::selftest {

// One block of 64 threads; per thread t (lane l = t % 32): out[6 t + 0..5] =
//   shfl(t, 31 - l), shfl_xor(t, 5), shfl_down(t, 3), shfl_up(t, 2, width 8), ballot(l odd) as int,
//   and a block sum of t over shared memory and __syncthreads, then a warp sum of that.
std::string shuffles_and_barriers(std::vector<long long>& out);
// Lane 5 of warp 0 waits at __syncthreads while the other lanes shuffle: a deadlock.
std::string deadlock();
// A full-mask shuffle in a warp whose lanes 16-31 have exited.
std::string exited_lane();
// Reads dynamic shared memory no thread wrote: out[t] is NaN for every thread.
std::string unwritten_shared(std::vector<float>& out);
// Two warps share data through shared memory without a __syncthreads between writer and reader: warp 1
// writes what warp 0 reads, then (after a barrier) warp 0 writes what warp 1 reads. The model runs each
// warp as far as it goes, ascending and then descending, so both reads come first: out[64] all NaN.
std::string missing_barrier(std::vector<float>& out);
// One warp; dynamic shared memory holds a 32 x P matrix of 16-bit elements m[r][c] = r P + c (P = pitch,
// 40: rows 16-byte aligned). Per lane, 14 registers each: `got` from device.cuh's ldmatrix helpers
// (a_of_rows rows 8, column 16; a_of_columns stored rows 16, stored column 8; b_of_rows rows 16, column 8;
// b_of_columns2 rows 8, chunk 0), `want` the same fragments gathered element by element as the PTX ISA's
// mma.m16n8k16 layouts say. Another pitch (36: misaligned rows) must fail the launch.
std::string ldmatrix_fragments(int pitch, std::vector<unsigned>& got, std::vector<unsigned>& want);
// One block of 64 threads, cp.async through device.cuh's helpers; in holds 512 floats. Thread t copies
// in[4t, +4) to shared A (group 0), zeros to shared B (src-size 0, group 0), in[256 + 4t, +4) to shared
// C (group 1); out[6 t + 0..5] = A before any wait (NaN), A and B after wait_group 1 (in[4t], 0), C then
// (NaN, not yet landed), C after wait_group 0 (in[256 + 4t]), and thread t ^ 1's A after a barrier.
// mode 1: the threads exit without waiting; 2: a misaligned source; 3: a destination in global memory.
std::string async_copies(int mode, const std::vector<float>& in, std::vector<float>& out);
// An empty kernel with this launch configuration (threads a block, dynamic shared memory bytes, and
// whether the kernel's limit was raised to `raised` bytes first).
std::string launch(unsigned threads, unsigned shared_bytes, int raised);

}  // namespace spanformer::cuda_emulator::selftest
