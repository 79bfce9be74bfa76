// The key table of the shared `train` section (internal to the library), used by every family's
// config reader so that JSON, overrides, `config keys` and the unknown-key check stay one table.
#pragma once
#include "fields.h"
#include "spanformer/config/train_config.h"

namespace spanformer::config_detail {

const std::vector<Field<TrainConfig>>& train_fields();

// Keys older configs and checkpoints spelt otherwise: {old name, current name}.
const std::vector<std::pair<std::string, std::string>>& train_key_aliases();

// Reads a `train` section, accepting the old spellings above; keys in `family_keys` (the family's
// own keys that older files kept in `train`) are handed to `other` instead.
void read_train_section(TrainConfig& t, const json& j, const std::string& origin,
                        const std::function<bool(const std::string&, const json&)>& other = nullptr);

}  // namespace spanformer::config_detail
