// The CUDA kernels' variants, one table per op: every name SPANFORMER_SPAN_KERNEL and
// SPANFORMER_FLASH_KERNEL take (unset or "auto": what the glue's rules pick, the only choice training and
// the tests' defaults make). A mainline row forces one of the kernels measured on a GPU, for A/B runs; a
// lab row (lab: true) names a variant of the lab (lab/cuda/, a target the library never links; lab/lab.h):
// built by nvcc, held to the reference on the CPU model of CUDA (tests/test_cuda_emulated.cpp takes every
// lab row of these tables), and timed by `scripts/gpu-check.sh tune`, whose figures promote it to the
// mainline or delete it. A new variant is one row here, its enum value, and its code under lab/cuda/.
#pragma once

namespace spanformer::ops::cuda {

enum class SpanVariant { automatic, v0, v1_backward_v0, v1b2, v1b3, v1b3_in_order, lab_async, lab_shortcuts };
enum class FlashVariant { automatic, v0, lab_keys, lab_m2, lab_async };

template <typename Id>
struct KernelVariant {
  Id id;
  const char* name;
  bool lab;
  const char* what;
};

inline constexpr KernelVariant<SpanVariant> kSpanVariants[] = {
    {SpanVariant::automatic, "auto", false, "forward version 1 at 2 or 3 blocks an SM by the heads' spans, backward version 2"},
    {SpanVariant::v0, "v0", false, "version 0 both ways"},
    {SpanVariant::v1_backward_v0, "v1-bwd-v0", false, "the automatic forward, version 0's backward"},
    {SpanVariant::v1b2, "v1b2", false, "forward version 1 at 2 blocks an SM"},
    {SpanVariant::v1b3, "v1b3", false, "forward version 1 at 3 blocks an SM"},
    {SpanVariant::v1b3_in_order, "v1b3-in-order", false, "3 blocks an SM, blocks in head order (not longest first)"},
    {SpanVariant::lab_async, "v1b2-async", true, "2 blocks an SM, tiles double-buffered with cp.async (D 32 / 64)"},
    {SpanVariant::lab_shortcuts, "v1b2-shortcuts", true,
     "2 blocks an SM, a warp's whole-tile shortcuts (no validity selects inside the window, no mask inside the span)"},
};

inline constexpr KernelVariant<FlashVariant> kFlashVariants[] = {
    {FlashVariant::automatic, "auto", false, "version 1 (tensor cores) for bf16 / fp16 at D 32, 64, 128; version 0 else"},
    {FlashVariant::v0, "v0", false, "version 0 both ways"},
    {FlashVariant::lab_keys, "v1-keys", true, "the backward's dk and dv by a key-major kernel, no atomics (D 32 / 64)"},
    {FlashVariant::lab_m2, "v1-m2", true, "the forward with 32 rows a warp, 128 queries a block (D 32 / 64)"},
    {FlashVariant::lab_async, "v1-async", true, "the forward with K / V tiles double-buffered by cp.async"},
};

}  // namespace spanformer::ops::cuda
