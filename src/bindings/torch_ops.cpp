// The PyTorch operators in the Python module (libspanformer_torch_ops.so, loaded by
// python/spanformer/__init__.py with torch.ops.load_library).
//
// The operators themselves are registered with torch.library where they are implemented
// (src/ops/adaptive_span_attention.cpp, src/ops/flash_attention.cpp), so the command line, C++ users and
// Python share one definition; this file only makes sure the module links those registrations (a
// static library contributes an object only when something refers to it). What Python sees:
//
//   adaptive_span_attention(q (B,K,M,D), k (B,K,W+M,D), v (B,K,W+M,D), key_pe (D,L), span_ratio (K),
//                           attn_span L, ramp R = 32, dropout p = 0, training = False, seed = -1,
//                           visited = []) -> (B,K,M,D)
//   flash_attention(q (B,K,N,D), k (B,K,C,D), v (B,K,C,D), band = 0 (dense causal), dropout = 0,
//                   training = False, seed = -1, tile = 256, cuda_kernel = True) -> (B,K,N,D)
//   *_reference: the plain compositions of the same formulas (the oracles), same arguments.
// seed < 0 draws the dropout stream from torch's default generator when the op runs (torch.manual_seed
// repeats it); both are differentiable, have fake (Meta) kernels and compile with torch.compile.
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"

namespace spanformer::bindings {

// Referenced by models.cpp's registration, so that the operators' objects are linked into the module.
void link_operators() {
  [[maybe_unused]] static auto span = &ops::adaptive_span_attention;
  [[maybe_unused]] static auto flash = &ops::flash_attention;
}

}  // namespace spanformer::bindings
