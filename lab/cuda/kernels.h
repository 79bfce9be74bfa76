// The lab's kernel entry points (lab/cuda/*.cu), which lab/register.cpp adds to the mainline launchers'
// table (LabKernels, src/ops/cuda/params.h). Each `applies` is false for the mainline's variants, so the
// mainline runs whatever the lab does not take.
#pragma once
#include "ops/cuda/params.h"

namespace spanformer::ops::cuda {

bool flash_lab_forward_applies(const FlashParams& p);
cudaError_t flash_lab_forward(const FlashParams& p, cudaStream_t stream);
// The lab's backward writes every element of dk and dv (the mainline's adds into zeroed buffers).
bool flash_lab_backward_applies(const FlashParams& p);
cudaError_t flash_lab_backward(const FlashParams& p, cudaStream_t stream);

bool span_lab_forward_applies(const SpanAttentionParams& p);
cudaError_t span_lab_forward(const SpanAttentionParams& p, cudaStream_t stream);

}  // namespace spanformer::ops::cuda
