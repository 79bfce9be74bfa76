// The flash attention CUDA kernels compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../src/ops/cuda/flash_attention_kernels.cu"
