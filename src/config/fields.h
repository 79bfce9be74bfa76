// Config tables shared by every config type (internal to the library).
//
// One table per struct: each entry names a key and says how to read and write the field, so JSON
// output, JSON input, `--key=value` overrides and the unknown-key check stay in sync.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "spanformer/util/error.h"
#include "spanformer/config/train_config.h"
#include "spanformer/util/io.h"
#include "spanformer/util/usage.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::config_detail {

using nlohmann::json;

template <typename V>
struct is_int_vector : std::false_type {};
template <>
struct is_int_vector<std::vector<int64_t>> : std::true_type {};

template <typename T>
struct Field {
  const char* name;
  std::function<json(const T&)> get;
  std::function<void(T&, const json&)> set;
  const char* help = "";
  std::vector<std::string> choices;  // a closed choice's names, from its name table (enum_field)
  bool run = false;          // how the model runs, not what its weights mean (see Role)
};

// A model struct's keys are of two kinds, written to two sections of the file:
//   model  what the weights mean: a checkpoint fits a config when these are equal;
//   run    how it runs (attention implementation, dropout, lengths, evaluation protocol, decoding):
//          what a command reading a checkpoint may override.
// A table marks its run keys with run_key(field(...)); `any` is a whole table (the other sections).
enum class Role { any, model, run };

template <typename T>
Field<T> run_key(Field<T> f) {
  f.run = true;
  return f;
}

template <typename T>
bool has_role(const Field<T>& f, Role role) {
  return role == Role::any || f.run == (role == Role::run);
}

template <typename T, typename V>
Field<T> field(const char* name, V T::*member, const char* help) {
  return {name, [member](const T& t) { return json(t.*member); },
          [member, name](T& t, const json& j) {
            try {
              if constexpr (std::is_same_v<V, bool>) {
                if (!j.is_boolean()) throw std::invalid_argument("expected true or false");
              } else if constexpr (std::is_integral_v<V>) {
                if (!j.is_number_integer() && !(j.is_number_float() && std::floor(j.get<double>()) == j.get<double>()))
                  throw std::invalid_argument("expected an integer");
                const double as_double = j.get<double>();
                if ((j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<V>::max())) ||
                    !(std::abs(as_double) <= 9.0e15))  // beyond this a double cannot say which integer is meant
                  throw std::invalid_argument("integer out of range");
                if constexpr (std::is_unsigned_v<V>) {
                  if (j.get<double>() < 0) throw std::invalid_argument("expected a non-negative integer");
                }
              } else if constexpr (is_int_vector<V>::value) {
                if (!j.is_array()) throw std::invalid_argument("expected a list of integers");
                for (const auto& e : j)
                  if (!e.is_number_integer()) throw std::invalid_argument("expected a list of integers");
              } else if constexpr (std::is_floating_point_v<V>) {
                if (!j.is_number() || !std::isfinite(j.get<double>())) throw std::invalid_argument("expected a finite number");
              } else {
                if (!j.is_string()) throw std::invalid_argument("expected a string");
              }
              if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
                t.*member = j.is_number_integer() ? j.get<V>() : static_cast<V>(j.get<double>());
              } else {
                t.*member = j.get<V>();
              }
            } catch (const std::exception& e) {
              fail("config key '{}': {} (got {})", name, e.what(), j.dump());
            }
          },
          help};
}

// The names of a closed choice in its enum's order, asked of its name table through to_name: the enums
// number their values 0, 1, ... and a name table answers "?" past its last entry (util/names.h).
template <typename E>
std::vector<std::string> choice_names(const char* (*to_name)(E)) {
  std::vector<std::string> names;
  for (int i = 0; i < 64; ++i) {
    const std::string name = to_name(static_cast<E>(i));
    if (name == "?") return names;
    names.push_back(name);
  }
  fail("config: a name table of more than 64 choices");  // a to_name that never says "?"
}

// A closed choice: an enum read from and written as its name, parsed once here at the config boundary
// (parse fails with a one-line error listing the choices). The names the key lists (`config keys`,
// docs/config.md) come from the same name table; help says what the choice means.
template <typename T, typename E>
Field<T> enum_field(const char* name, E T::*member, E (*parse)(const std::string&), const char* (*to_name)(E),
                    const char* help) {
  Field<T> f{name, [member, to_name](const T& t) { return json(to_name(t.*member)); },
             [member, name, parse](T& t, const json& j) {
               if (!j.is_string()) fail("config key '{}': expected a string (got {})", name, j.dump());
               try {
                 t.*member = parse(j.get<std::string>());
               } catch (const Error& e) {
                 fail("config key '{}': {}", name, e.what());
               }
             },
             help};
  f.choices = choice_names(to_name);
  return f;
}

template <typename T>
json struct_to_json(const T& t, const std::vector<Field<T>>& fields, Role role = Role::any) {
  json j = json::object();
  for (const auto& f : fields)
    if (has_role(f, role)) j[f.name] = f.get(t);
  return j;
}

template <typename T>
const Field<T>* find_field(const std::vector<Field<T>>& fields, const std::string& name) {
  for (const auto& f : fields)
    if (name == f.name) return &f;
  return nullptr;
}

// Reads a section's keys. The model section also takes the table's run keys: files written before the
// run section existed kept them there (and still load).
template <typename T>
void read_section(T& t, const json& j, const std::vector<Field<T>>& fields, const std::string& section,
                  const std::string& origin, Role role = Role::any) {
  if (!j.is_object()) fail("{}: '{}' must be a JSON object", origin, section);
  for (const auto& [key, value] : j.items()) {
    const auto* f = find_field(fields, key);
    if (!f) fail("{}: unknown config key '{}.{}'", origin, section, key);
    if (role == Role::run && !f->run)
      fail("{}: '{}.{}' is part of what the model is: it belongs in the 'model' section", origin, section, key);
    f->set(t, value);
  }
}

inline json read_json_file(const std::string& path) { return read_config_file(path); }

// One `--key=value` override. Keys may be qualified ("model.dropout") or bare ("dropout", unique across
// sections); '-' in keys reads as '_'. `value` is the text parsed as JSON, or the text itself.
struct Override {
  std::string item, section, key, text;
  json value;
};

inline Override parse_override(std::string item,
                               const std::vector<std::pair<std::string, std::string>>& aliases = {}) {
  if (item.rfind("--", 0) == 0) item = item.substr(2);
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0) fail_usage("override '{}' must look like --key=value or --key value", item);
  Override o;
  o.item = item;
  o.key = item.substr(0, eq);
  o.text = item.substr(eq + 1);
  for (auto& c : o.key)
    if (c == '-') c = '_';
  if (auto dot = o.key.find('.'); dot != std::string::npos) {
    o.section = o.key.substr(0, dot);
    o.key = o.key.substr(dot + 1);
  }
  for (const auto& [old_name, name] : aliases)
    if (o.key == old_name) o.key = name;
  try {
    o.value = parse_json(o.text, fmt::format("config key '{}'", o.key));
  } catch (const json::parse_error&) {
    o.value = o.text;  // a bare string such as adagrad or a path
  } catch (const json::out_of_range&) {
    fail("config key '{}': {} is out of range for a number", o.key, o.text);
  }
  return o;
}

// Sets t's field named by the override when the section fits and t has that key (returns false
// otherwise). String-valued keys take the text as it is, so "1e-3" stays a string only where strings belong.
// A model section also takes its run keys when qualified with the old spelling ("model.dropout").
template <typename T>
bool set_override(T& t, const std::vector<Field<T>>& fields, const std::string& section, const Override& o,
                  Role role = Role::any) {
  if (!o.section.empty() && o.section != section) return false;
  const auto* f = find_field(fields, o.key);
  if (!f || !(has_role(*f, role) || (role == Role::model && o.section == section))) return false;
  f->set(t, f->get(t).is_string() ? json(o.text) : o.value);
  return true;
}

// The error of an override no section has: a usage error naming the key, with the closest key of
// `keys` (the arch's, as `spanformer config keys` lists them) when one is near.
[[noreturn]] inline void unknown_override(const Override& o, const std::vector<ConfigKey>& keys) {
  std::vector<std::string> names;
  for (const auto& k : keys) names.push_back(o.section.empty() ? k.name : k.section + "." + k.name);
  const std::string key = o.section.empty() ? o.key : o.section + "." + o.key;
  fail_usage("unknown config key '{}' in override '{}'{}", key, o.item, did_you_mean(key, names));
}

// Checks every family's validate() shares: "config: NAME must be positive (got V)" and
// "config: NAME must be in [0, 1) (got V)" (dropout rates and the like).
inline void require_positive(const char* name, int64_t v) {
  if (v <= 0) fail("config: {} must be positive (got {})", name, v);
}
inline void require_fraction(const char* name, double v) {
  if (!(v >= 0 && v < 1)) fail("config: {} must be in [0, 1) (got {})", name, v);
}

// One line per key for `spanformer config keys`: "section.key  type  default  help".
template <typename T>
void describe(std::vector<ConfigKey>& out, const std::string& section, const T& defaults,
              const std::vector<Field<T>>& fields, Role role = Role::any) {
  for (const auto& f : fields) {
    if (!has_role(f, role)) continue;
    const json v = f.get(defaults);
    std::string type = !f.choices.empty() ? "choice" : v.is_boolean() ? "bool" : v.is_number_integer() ? "int"
                       : v.is_number() ? "float" : v.is_array() ? "list of int" : "string";
    out.push_back({section, f.name, type, v.dump(), f.help, f.choices});
  }
}

}  // namespace spanformer::config_detail
