// The flash kernels' lab variants compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../lab/cuda/flash_attention_lab.cu"
