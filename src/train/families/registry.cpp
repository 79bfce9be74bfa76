// The family table (train/registry.h) and the factories that read it.
#include "spanformer/train/registry.h"

#include <fmt/format.h>

#include "spanformer/train/family.h"
#include "spanformer/util/error.h"

namespace spanformer::train {

#define SPANFORMER_DECLARE(id, name, description)                                                           \
  std::unique_ptr<Family> make_##id##_family(const nlohmann::json& config, const std::string& origin,       \
                                             const std::vector<std::string>& overrides);                    \
  std::vector<BenchSetting> id##_bench_settings();
SPANFORMER_FAMILIES(SPANFORMER_DECLARE)
#undef SPANFORMER_DECLARE

}  // namespace spanformer::train

namespace spanformer {
#define SPANFORMER_DECLARE(id, name, description) std::vector<ConfigKey> id##_config_keys();
SPANFORMER_FAMILIES(SPANFORMER_DECLARE)
#undef SPANFORMER_DECLARE
}  // namespace spanformer

namespace spanformer::train {

const std::vector<FamilyInfo>& families() {
#define SPANFORMER_ROW(id, name, description) \
  FamilyInfo{name, description, &make_##id##_family, &id##_config_keys, &id##_bench_settings},
  static const std::vector<FamilyInfo> table{SPANFORMER_FAMILIES(SPANFORMER_ROW)};
#undef SPANFORMER_ROW
  return table;
}

std::string family_names() {
  std::string out;
  const auto& all = families();
  for (size_t i = 0; i < all.size(); ++i) out += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + std::string(all[i].name);
  return out;
}

const FamilyInfo& family_info(const std::string& name, const std::string& origin) {
  for (const auto& f : families())
    if (name == f.name) return f;
  fail("{}: unknown arch '{}' ({})", origin, name, family_names());
}

std::string config_arch(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) fail("{}: a config must be a JSON object", origin);
  if (!j.contains("arch")) return families().front().name;
  if (!j["arch"].is_string()) fail("{}: arch must be a string ({})", origin, family_names());
  return j["arch"].get<std::string>();
}

void check_bench_settings(const FamilyInfo& family, const BenchRequest& request) {
  const auto listed = family.bench_settings();
  for (const auto& [name, value] : request.settings) {
    bool found = false;
    for (const auto& s : listed) found = found || name == s.name;
    if (found) continue;
    std::string names;
    for (const auto& s : listed) names += (names.empty() ? "--" : ", --") + std::string(s.name);
    fail("bench: --{} is not a setting of the {} family ({})", name, family.name,
         names.empty() ? "it has none beyond --mode, --steps, --warmup and --json" : "its settings: " + names);
  }
}

namespace {

std::unique_ptr<Family> make_family(const std::string& arch, const nlohmann::json& config, const std::string& origin,
                                    const std::vector<std::string>& overrides) {
  return family_info(arch, origin).make(config, origin, overrides);
}

}  // namespace

std::unique_ptr<Family> family_from_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  auto j = read_config_file(path);
  return make_family(config_arch(j, path), j, path, overrides);
}

std::unique_ptr<Family> family_from_json(const nlohmann::json& config, const std::string& origin,
                                         const std::vector<std::string>& overrides) {
  return make_family(config_arch(config, origin), config, origin, overrides);
}

std::unique_ptr<Family> family_from_checkpoint(const Checkpoint& checkpoint, const std::vector<std::string>& overrides) {
  auto family = make_family(checkpoint.family(), checkpoint.config(), checkpoint.path(), overrides);
  if (!overrides.empty()) {
    // A command that reads a checkpoint trains nothing: an override of a training key would be
    // silently ignored, so it is refused (the evaluation batch, threads and device are used).
    const auto before = make_family(checkpoint.family(), checkpoint.config(), checkpoint.path(), {})->config_json();
    const auto after = family->config_json();
    for (auto it = after["train"].begin(); it != after["train"].end(); ++it) {
      const std::string& key = it.key();
      if (key == "eval_batch_size" || key == "threads" || key == "device") continue;
      if (!before["train"].contains(key) || before["train"][key] != it.value())
        fail("the override of train.{} is not used when a checkpoint is read (it only affects training)", key);
    }
  }
  family->validate();
  family->set_vocabulary(checkpoint.vocab());
  family->build();
  family->load_weights(checkpoint);  // refuses overrides that change the model
  return family;
}

}  // namespace spanformer::train
