// The one list of model families. Each row names a family (the config's "arch" and the checkpoint's
// family tag), says in one line what it is, and points at its factory and its config keys; the
// factory (family_from_config_file / _json / _checkpoint in train/family.h), `spanformer config keys
// --arch`, `spanformer config families` and the docs' family list (checked by tests/cli_errors.sh)
// all read this table and nothing else.
//
// Adding a family: its folder under src/train/families/ (CMake picks it up) defines make_<id>_family,
// <id>_config_keys and <id>_bench_settings, and one row below lists it (src/train/families/registry.cpp
// expands the rows).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "spanformer/config/train_config.h"

// X(id, arch name, one-line description), in the order users read them; the first is the default arch
// of a config without one.
#define SPANFORMER_FAMILIES(X)                                                                                \
  X(adaptive_span, "adaptive-span", "Sukhbaatar et al. 2019: a byte/word LM whose heads learn their spans")   \
  X(xl, "xl", "Transformer-XL (Dai et al. 2019) and PAR (Mandava et al. 2020): memories, relative positions") \
  X(gpt, "gpt", "a GPT decoder with seven drop-in causal attentions and a KV cache")                          \
  X(vit, "vit", "a Vision Transformer (Dosovitskiy et al. 2021) classifying images")                          \
  X(seq2seq, "seq2seq", "translation: RNN + Bahdanau/Luong attention, or the Transformer, with BLEU")     \
  /* a new family: one row above this line */

namespace spanformer::train {

class Family;
struct BenchRequest;

// One setting of `spanformer bench` a family reads (--name VALUE): the command line offers the union of
// every family's, and refuses one the config's family does not list.
struct BenchSetting {
  const char* name;  // without the dashes
  const char* help;
};

using FamilyFactory = std::unique_ptr<Family> (*)(const nlohmann::json& config, const std::string& origin,
                                                  const std::vector<std::string>& overrides);

struct FamilyInfo {
  const char* name;         // the config's arch, the checkpoint's family tag
  const char* description;  // one line
  FamilyFactory make;       // a family from a config (JSON, already read) with the command line's overrides
  std::vector<ConfigKey> (*config_keys)();  // every key with type, default and help (defaults included)
  std::vector<BenchSetting> (*bench_settings)();  // what its bench reads besides the common flags
};

// Every family, in the order of SPANFORMER_FAMILIES.
const std::vector<FamilyInfo>& families();
// The row of `name`, or "<origin>: unknown arch '<name>' (adaptive-span, xl, ...)".
const FamilyInfo& family_info(const std::string& name, const std::string& origin);
// "adaptive-span, xl, gpt, vit or seq2seq".
std::string family_names();
// The arch of a config (the first family when the config names none); one-line errors for non-objects.
std::string config_arch(const nlohmann::json& config, const std::string& origin);
// Refuses a bench setting the family does not list: "bench: --mem-len is not a setting of the gpt family
// (its settings: --span, --span-dist, --tokens)".
void check_bench_settings(const FamilyInfo& family, const BenchRequest& request);

}  // namespace spanformer::train
