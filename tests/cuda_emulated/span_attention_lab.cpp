// The adaptive-span forward's lab variants compiled unchanged for the CPU model of CUDA (tests/cuda_emulated/emulator.h).
#include "../../lab/cuda/span_attention_lab.cu"
