// One name table per closed choice (a config key's enum, a command's mode): the names written once, in
// the enum's order, read both ways; parsing fails in one line naming every choice, e.g.
//   attn_impl must be auto, fused or plain (got 'fast')
//
//   constexpr auto kAttnImplNames = name_table("attn_impl", std::pair{AttnImpl::kAuto, "auto"}, ...);
//   kAttnImplNames.name(AttnImpl::kFused) == "fused";  kAttnImplNames.parse("plain") == AttnImpl::kPlain
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <utility>

#include "spanformer/util/error.h"

namespace spanformer {

template <typename E, size_t N>
struct NameTable {
  const char* key;  // what the value is called in errors (the config key)
  std::array<std::pair<E, const char*>, N> entries;

  const char* name(E value) const {
    for (const auto& [e, n] : entries)
      if (e == value) return n;
    return "?";
  }
  E parse(const std::string& text) const {
    for (const auto& [e, n] : entries)
      if (text == n) return e;
    fail("{} must be {} (got '{}')", key, choices(), text);
  }
  std::string choices() const {  // "a, b or c"
    std::string out;
    for (size_t i = 0; i < N; ++i) out += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(entries[i].second);
    return out;
  }
};

template <typename E, typename... Rest>
constexpr NameTable<E, 1 + sizeof...(Rest)> name_table(const char* key, std::pair<E, const char*> first, Rest... rest) {
  return {key, {{first, rest...}}};
}

}  // namespace spanformer
