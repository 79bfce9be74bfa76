// Transformer-XL weights in the layout of kimiyoung/transformer-xl's PyTorch MemTransformerLM
// state_dict (pytorch/mem_transformer.py, attn_type 0). Names, ours -> reference, for layer l
// (our blocks 2l = attention 'a', 2l + 1 = feed-forward 'f'):
//   word_emb.table_i (V_i, E_i)           -> word_emb.emb_layers.i.weight
//   word_emb.proj_i (P, E_i)              -> word_emb.emb_projs.i
//   r_w_bias, r_r_bias (K, D)             -> r_w_bias, r_r_bias
//     (untie_r: attn_{2l}.r_w_bias        -> layers.l.dec_attn.r_w_bias, likewise r_r_bias: the layout of
//      the untied models converted from the TF release, e.g. by HuggingFace's converter)
//   attn_{2l}.qkv.weight (3KD, H)         -> layers.l.dec_attn.qkv_net.weight
//   attn_{2l}.r_net.weight (KD, H)        -> layers.l.dec_attn.r_net.weight
//   attn_{2l}.o_net.weight (H, KD)        -> layers.l.dec_attn.o_net.weight
//   attn_{2l}.norm.{weight,bias} (H)      -> layers.l.dec_attn.layer_norm.{weight,bias}
//   ff_{2l+1}.fc1.{weight,bias}           -> layers.l.pos_ff.CoreNet.0.{weight,bias}
//   ff_{2l+1}.fc2.{weight,bias}           -> layers.l.pos_ff.CoreNet.3.{weight,bias}
//   ff_{2l+1}.norm.{weight,bias}          -> layers.l.pos_ff.layer_norm.{weight,bias}
//   crit.weight_i / crit.bias_i           -> crit.out_layers.i.{weight,bias}
//   crit.proj_i                           -> crit.out_projs.i
//   crit.cluster_{weight,bias}            -> crit.cluster_{weight,bias}
// plus the derivable buffer pos_emb.inv_freq (H / 2). A tied tensor (tie_weight: crit.out_layers.i.weight
// = word_emb.emb_layers.i.weight; tie_projs: crit.out_projs.i = word_emb.emb_projs.{i or 0} for i >= 1)
// appears under each of its names, as in PyTorch's state_dict; on reading, its copies must be equal.
// A leading "module." (DataParallel) is accepted on reading.
//
// The reference saves the whole model object (train.py: torch.save(model, f)); users extract a plain
// dict in Python, in the reference's pytorch/ directory so that the class can be unpickled:
//   torch.save(dict(torch.load('model.pt', map_location='cpu').state_dict()), 'state.pt')
//
// Only models the reference can express have this layout: the plain block order (af)^n_layer, no
// architecture search, no adaptive span.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "spanformer/models/xl.h"

namespace spanformer::io {

// Every entry of the reference's state_dict for this model: (reference name, our tensor), tied
// tensors under each name, inv_freq computed. Fails in one line for models outside the layout.
std::vector<std::pair<std::string, torch::Tensor>> xl_reference_entries(models::xl::XlModel& model);

// Loads a MemTransformerLM state_dict; every name and shape is checked against the model (missing,
// unexpected, mis-shaped, or tied copies that differ are named in the error).
void load_xl_state_dict(models::xl::XlModel& model, const std::string& path);

// Writes the model as a MemTransformerLM state_dict (torch.save's zip format), atomically.
void save_xl_state_dict(models::xl::XlModel& model, const std::string& path);

}  // namespace spanformer::io
