// spanformer config keys: every config key of a family with its type, default and meaning;
// spanformer config families: the families (train/registry.h).
#include <fmt/format.h>

#include "command.h"
#include "spanformer/train/registry.h"

namespace spanformer::cli {

void add_config(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  auto arch = std::make_shared<std::string>(train::families().front().name);
  auto* config = app.add_subcommand("config", "describe configs");
  config->require_subcommand(1);
  std::vector<std::string> names;
  for (const auto& f : train::families()) names.push_back(f.name);
  auto* keys = config->add_subcommand("keys", "list every key of a family's config: section.key, type, default, help");
  keys->add_option("--arch", *arch, "the family: " + train::family_names())->capture_default_str()->check(CLI::IsMember(names));
  keys->callback([arch, &run] {
    run = [arch] {
      const auto keys = train::family_info(*arch, "--arch").config_keys();
      std::string shape = fmt::format("{{\"arch\": \"{}\"", *arch);
      for (size_t i = 0; i < keys.size(); ++i)
        if (i == 0 || keys[i].section != keys[i - 1].section) shape += fmt::format(", \"{}\": {{...}}", keys[i].section);
      fmt::print("# {} config: {}}}; any key can be given as --key=value or --section.key=value after the command\n"
                 "# model: what the weights mean (a checkpoint fits a config whose model keys are equal); run: how "
                 "they run (a command reading a checkpoint may override these)\n",
                 *arch, shape);
      for (const auto& k : keys)
        fmt::print("{:<28} {:<12} {:<12} {}\n", k.section + "." + k.name, k.type, k.default_value, k.described());
    };
  });
  auto* list = config->add_subcommand("families", "list the model families (a config's \"arch\"), one per line");
  list->callback([&run] {
    run = [] {
      for (const auto& f : train::families()) fmt::print("{:<14} {}\n", f.name, f.description);
    };
  });
}

}  // namespace spanformer::cli
