// Hugging Face's GPT-2 layout (transformers' GPT2LMHeadModel; the mapping in src/io/gpt2.cpp): a directory
// with config.json, model.safetensors and spanformer's vocab.txt. Export takes a gpt-family checkpoint
// whose model GPT-2 can express (dense or flash attention, learned positions, not reversible) and refuses
// any other in one line; import reads what save_pretrained writes (the vocabulary from --vocab, else the
// directory's vocab.txt) into a weights-only checkpoint, and returns whether the weights carried
// spanformer's checksum. The command line reaches both through the formats table (train/formats.h).
#pragma once
#include <string>

namespace spanformer::train {
class Checkpoint;
}

namespace spanformer::io {

void export_gpt2(const train::Checkpoint& checkpoint, const std::string& dir);
bool import_gpt2(const std::string& dir, const std::string& vocab_path, const std::string& vocab_level,
                 const std::string& checkpoint_path);

}  // namespace spanformer::io
