// The adaptive-span tensor-core forward (v1) compiled unchanged for the CPU model of CUDA (src/ops/cuda/emulator.h).
#include "../../src/ops/cuda/span_attention_mma_kernels.cu"
