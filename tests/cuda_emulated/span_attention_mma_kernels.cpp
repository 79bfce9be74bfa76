// The adaptive-span tensor-core forward (v1) compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../src/ops/cuda/span_attention_mma_kernels.cu"
