// Reading state_dicts written by the Python reference (facebookresearch/adaptive-span) with
// LibTorch's unpickler, and mapping their names onto spanformer's:
//   module.in_emb.weight                                   -> in_emb.weight
//   module.out_emb.{weight,bias}                           -> out_emb.{weight,bias}
//   module.key_pe (1, D, L)                                -> key_pe (D, L)
//   module.layers.i.attn.attn.adaptive_span._mask.current_val (K, 1, 1) -> layers.i.attn.span.span_ratio (K)
//   module.layers.i.attn.proj_{query,key,val,out}.weight   -> layers.i.attn.proj_*.weight
//   module.layers.i.ff.fc{1,2}.{weight,bias}               -> layers.i.fc{1,2}.*
//   module.layers.i.norm{1,2}.{weight,bias}                -> layers.i.norm{1,2}.*
//   module.layers.i.attn.attn.persistent_memory.{key,val}  -> layers.i.attn.pers_{key,val}
// (the "module." prefix is optional; mask_template buffers are derivable and ignored).
#pragma once
#include <string>

#include "spanformer/models/transformer_seq.h"

namespace spanformer::io {

// Loads a plain dict of tensors saved with torch.save into `model`; every name and shape is checked
// (missing, unexpected or mis-shaped tensors are named in the error).
void load_reference_state_dict(models::TransformerSeq& model, const std::string& path);

}  // namespace spanformer::io
