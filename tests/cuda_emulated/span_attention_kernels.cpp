// The adaptive-span CUDA kernels compiled unchanged for the CPU model of CUDA (src/ops/cuda/emulator.h).
#include "../../src/ops/cuda/span_attention_kernels.cu"
