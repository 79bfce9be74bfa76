// The Python reference's checkpoints (facebookresearch/adaptive-span): reading its state_dicts with
// LibTorch's unpickler, and writing ours in its layout. Names, ours -> reference:
//   in_emb.weight                       -> module.in_emb.weight
//   out_emb.{weight,bias}               -> module.out_emb.{weight,bias}
//   key_pe (D, L)                       -> module.key_pe (1, D, L)
//   layers.i.attn.span.span_ratio (K)   -> module.layers.i.attn.attn.adaptive_span._mask.current_val (K, 1, 1)
//   layers.i.attn.proj_X.weight         -> module.layers.i.attn.proj_X.weight   (X = query, key, val, out)
//   layers.i.attn.pers_{key,val}        -> module.layers.i.attn.attn.persistent_memory.{key,val}
//   layers.i.fc{1,2}.{weight,bias}      -> module.layers.i.ff.fc{1,2}.{weight,bias}
//   layers.i.norm{1,2}.{weight,bias}    -> module.layers.i.norm{1,2}.{weight,bias}
// plus the derivable buffer module.layers.i.attn.attn.adaptive_span._mask.mask_template
// = linspace(1 - L, 0, L). On reading, the "module." prefix is optional.
//
// LibTorch cannot unpickle the reference's full checkpoint (it pickles a logger object) nor an
// OrderedDict, so users first extract a plain dict in Python:
//   torch.save(dict(torch.load(path, map_location='cpu')['model']), 'model.pt')
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "spanformer/models/transformer_seq.h"

namespace spanformer::io {

// The reference's name of one of our parameters.
std::string reference_name(const std::string& name);

// Loads a plain dict of tensors saved with torch.save into `model`; every name and shape is checked
// against the model (missing, unexpected or mis-shaped tensors are named in the error).
void load_reference_state_dict(models::TransformerSeq& model, const std::string& path);

// Writes the model as a state_dict the reference's model.load_state_dict accepts (with the
// "module." prefix of its DataParallel wrapper), in torch.save's zip format, atomically.
void save_reference_state_dict(models::TransformerSeq& model, const std::string& path);

// A plain dict of tensors written by torch.save (names in file order); `extraction` is the Python line
// that makes one, for the error message.
std::vector<std::pair<std::string, torch::Tensor>> read_state_dict(const std::string& path, const std::string& extraction);
// Writes name -> tensor as torch.save does (zip format; torch.load reads it), atomically.
void write_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& entries, const std::string& path);

}  // namespace spanformer::io
