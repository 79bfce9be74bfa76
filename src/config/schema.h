// A family's whole config as one schema (internal to the library): the "arch" tag, free "description"
// text and named sections, each a member struct with its key table (fields.h). Every family's reader,
// writer, override rule and `config keys` listing is this one template, so families differ only in
// their tables:
//
//   {"arch": "gpt", "model": {...}, "run": {...},          Schema{"gpt", "GPT", {model_section(...),
//    "train": {...}}                                                              run_section(...),
//                                                                                  train_section(...)}}
//
// "model" says what the weights mean and "run" how they run (fields.h: Role); both come from the same
// key table of the family's model struct. A checkpoint fits a config when their model sections are
// equal (model_difference); a command reading a checkpoint may override run keys.
#pragma once
#include <string>
#include <vector>

#include "fields.h"
#include "train_fields.h"

namespace spanformer::config_detail {

template <typename C>
struct Section {
  std::string name;
  std::function<json(const C&)> write;
  std::function<void(C&, const json&, const std::string& origin)> read;
  std::function<bool(C&, const Override&)> set;  // false when the override is not this section's
  std::function<void(std::vector<ConfigKey>&, const C& defaults)> describe;
};

// The section `name` held in C::*member, read and written through the key table `fields()`; with a
// role, only that role's keys of the table (fields.h: Role).
template <typename C, typename S>
Section<C> section(const char* name, S C::*member, const std::vector<Field<S>>& (*fields)(), Role role = Role::any) {
  return {name, [=](const C& c) { return struct_to_json(c.*member, fields(), role); },
          [=](C& c, const json& j, const std::string& origin) { read_section(c.*member, j, fields(), name, origin, role); },
          [=](C& c, const Override& o) { return set_override(c.*member, fields(), name, o, role); },
          [=](std::vector<ConfigKey>& out, const C& d) { describe(out, name, d.*member, fields(), role); }};
}

// A family's model struct as its two sections, "model" and "run" (fields.h: Role).
template <typename C, typename S>
Section<C> model_section(S C::*member, const std::vector<Field<S>>& (*fields)()) {
  return section("model", member, fields, Role::model);
}
template <typename C, typename S>
Section<C> run_section(S C::*member, const std::vector<Field<S>>& (*fields)()) {
  return section("run", member, fields, Role::run);
}

// The shared `train` section (old key spellings accepted); `other` takes the keys that older files of a
// family kept in `train` (returns false for a key it does not know either).
template <typename C>
Section<C> train_section(TrainConfig C::*member,
                         std::function<bool(C&, const std::string&, const json&)> other = nullptr) {
  Section<C> s = section("train", member, &train_fields);
  s.read = [=](C& c, const json& j, const std::string& origin) {
    if (!other) return read_train_section(c.*member, j, origin);
    read_train_section(c.*member, j, origin, [&](const std::string& key, const json& v) { return other(c, key, v); });
  };
  return s;
}

template <typename C>
struct Schema {
  const char* arch;   // the tag written and required on reading; nullptr: neither (the first family's files)
  const char* title;  // for "not a GPT config"
  std::vector<Section<C>> sections;
  std::function<void(Override&)> adjust = nullptr;  // renames an override's section before it is set
  // Puts the model section in one form where two spellings mean the same weights (GPT: flash is dense).
  std::function<void(json& model)> same_weights = nullptr;

  std::vector<ConfigKey> keys() const {
    std::vector<ConfigKey> out;
    const C defaults;
    for (const auto& s : sections) s.describe(out, defaults);
    return out;
  }

  json to_json(const C& c) const {
    json j = json::object();
    if (arch) j["arch"] = arch;
    for (const auto& s : sections) j[s.name] = s.write(c);
    return j;
  }

  C from_json(const json& j, const std::string& origin) const {
    if (!j.is_object()) fail("{}: a config must be a JSON object with sections {}", origin, names());
    if (arch && (!j.contains("arch") || j["arch"] != arch))
      fail("{}: not a {} config (\"arch\": \"{}\" missing)", origin, title, arch);
    C c;
    for (const auto& [key, value] : j.items()) {
      if (key == "arch" || key == "description") continue;  // the family (already chosen); text for people
      const Section<C>* s = nullptr;
      for (const auto& candidate : sections)
        if (candidate.name == key) s = &candidate;
      if (!s) fail("{}: unknown config section '{}' (expected {})", origin, key, names());
      s->read(c, value, origin);
    }
    return c;
  }

  // "" when a and b have the same model section (a checkpoint made with one fits the other), else the
  // first key that differs: "n_layer 4 vs 2".
  std::string model_difference(const C& a, const C& b) const {
    const Section<C>* model = nullptr;
    for (const auto& s : sections)
      if (s.name == "model") model = &s;
    json ja = model->write(a), jb = model->write(b);
    if (same_weights) {
      same_weights(ja);
      same_weights(jb);
    }
    for (const auto& [key, value] : ja.items())
      if (jb[key] != value) return fmt::format("{} {} vs {}", key, value.dump(), jb[key].dump());
    return "";
  }

  void apply_overrides(C& c, const std::vector<std::string>& overrides) const {
    for (const auto& item : overrides) {
      auto o = parse_override(item, train_key_aliases());
      if (adjust) adjust(o);
      bool set = false;
      for (const auto& s : sections)
        if (!set) set = s.set(c, o);
      if (!set) unknown_override(o, keys());
    }
  }

 private:
  std::string names() const {  // 'model', 'search' and 'train'
    std::string out;
    for (size_t i = 0; i < sections.size(); ++i)
      out += (i == 0 ? "'" : i + 1 == sections.size() ? " and '" : ", '") + sections[i].name + "'";
    return out;
  }
};

}  // namespace spanformer::config_detail
