// The flash attention tensor-core kernels (v1) compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../src/ops/cuda/flash_attention_mma_kernels.cu"
