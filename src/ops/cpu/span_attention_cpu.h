// CPU kernel of adaptive-span attention (see include/spanformer/ops/adaptive_span_attention.h for the
// semantics): the `cpu` row of src/ops/backends.h, which declares its two functions. Internal header:
// inputs are already checked and contiguous, options.visited resolved.
#pragma once
#include "../backends.h"
