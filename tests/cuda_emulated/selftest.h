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
// One warp; dynamic shared memory holds a 32 x P matrix of 16-bit elements m[r][c] = r P + c (P = pitch,
// 40: rows 16-byte aligned). Per lane, 14 registers each: `got` from device.cuh's ldmatrix helpers
// (a_of_rows rows 8, column 16; a_of_columns stored rows 16, stored column 8; b_of_rows rows 16, column 8;
// b_of_columns2 rows 8, chunk 0), `want` the same fragments gathered element by element as the PTX ISA's
// mma.m16n8k16 layouts say. Another pitch (36: misaligned rows) must fail the launch.
std::string ldmatrix_fragments(int pitch, std::vector<unsigned>& got, std::vector<unsigned>& want);
// An empty kernel with this launch configuration (threads a block, dynamic shared memory bytes, and
// whether the kernel's limit was raised to `raised` bytes first).
std::string launch(unsigned threads, unsigned shared_bytes, int raised);

}  // namespace spanformer::cuda_emulator::selftest
