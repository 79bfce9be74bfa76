#include <cstdlib>

#include "command.h"
#include "spanformer/dist/launcher.h"
#include "spanformer/util/error.h"

namespace spanformer::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"train", add_train}, {"eval", add_eval},     {"generate", add_generate}, {"spans", add_spans},
      {"bench", add_bench}, {"import", add_import}, {"export", add_export},     {"data", add_data},
      {"par", add_par},     {"config", add_config}, {"attention", add_attention}, {"example", add_example},
      {"translate", add_translate}, {"report", add_report},
  };
  return list;
}

std::vector<std::string> execution_overrides(const Globals& g) {
  if (g.attn_impl.empty()) return {};
  return {"--attn_impl=" + g.attn_impl};
}

std::vector<std::string> config_overrides(const CLI::App& command) {
  const auto extras = command.remaining();
  std::vector<std::string> out;
  for (size_t i = 0; i < extras.size(); ++i) {
    const auto& a = extras[i];
    const bool bare_key = a.rfind("--", 0) == 0 && a.find('=') == std::string::npos;
    if (bare_key && i + 1 < extras.size() && extras[i + 1].rfind("--", 0) != 0) {
      out.push_back(a + "=" + extras[i + 1]);
      ++i;
    } else {
      out.push_back(a);
    }
  }
  return out;
}

bool launch_workers(int nproc, const std::vector<std::string>& argv) {
  if (nproc < 1) fail("--nproc-per-node must be at least 1 (got {})", nproc);
  if (nproc == 1 || std::getenv("RANK")) return false;
  std::vector<std::string> args;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--nproc-per-node") {
      ++i;
      continue;
    }
    if (argv[i].rfind("--nproc-per-node=", 0) == 0) continue;
    args.push_back(argv[i]);
  }
  const int status = dist::spawn_local_workers(nproc, args);
  if (status != 0) std::exit(status);
  return true;
}

}  // namespace spanformer::cli
