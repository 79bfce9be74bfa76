// The fused step kernels compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../src/ops/cuda/step_kernels.cu"
