// The fused step kernels compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../lab/cuda/step_kernels.cu"
