// The lab: kernels awaiting a GPU (docs/platform.md, "Awaiting a GPU"), in a target of their own
// (spanformer_lab) that the library never links. A program that links it calls register_rows() once,
// before its first op (lab/with_lab.cpp does so for the test binary, and for the command-line tool and
// the Python module in a build with -DSPANFORMER_LAB=ON), which adds
//   - the CUDA kernel variants of the span and flash ops (the lab rows of src/ops/cuda/variants.h) to
//     the mainline launchers' table (LabKernels, src/ops/cuda/params.h);
//   - the fused step kernels as the step ops' kernel row (include/spanformer/ops/step_ops.h).
// A kernel leaves the lab when a GPU's figures earn it: moved under src/ with a version line in
// docs/kernels.md, or deleted.
#pragma once

namespace spanformer::lab {

void register_rows();
// Takes the CUDA variants out of the launchers' table (false) or puts them back (true): what a program
// without the lab sees, for the tests of that case.
void set_kernel_rows(bool present);

}  // namespace spanformer::lab
