// spanformer config keys: every config key of a family with its type, default and meaning.
#include <fmt/format.h>

#include "command.h"
#include "spanformer/config/train_config.h"

namespace spanformer::cli {

void add_config(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  auto arch = std::make_shared<std::string>("adaptive-span");
  auto* config = app.add_subcommand("config", "describe configs");
  config->require_subcommand(1);
  auto* keys = config->add_subcommand("keys", "list every key of a family's config: section.key, type, default, help");
  keys->add_option("--arch", *arch, "adaptive-span | xl | gpt | vit | seq2seq")->capture_default_str()->check(CLI::IsMember({"adaptive-span", "xl", "gpt", "vit", "seq2seq"}));
  keys->callback([arch, &run] {
    run = [arch] {
      fmt::print("# {} config: {{\"arch\": \"{}\", \"model\": {{...}}, \"train\": {{...}}}}; any key can be given as "
                 "--key=value or --section.key=value after the command\n",
                 *arch, *arch);
      for (const auto& k : config_keys(*arch))
        fmt::print("{:<28} {:<12} {:<12} {}\n", k.section + "." + k.name, k.type, k.default_value, k.help);
    };
  });
}

}  // namespace spanformer::cli
