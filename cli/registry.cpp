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
      {"translate", add_translate},
  };
  return list;
}

std::vector<std::string> execution_overrides(const Globals& g) {
  if (g.attn_impl.empty()) return {};
  return {"--attn_impl=" + g.attn_impl};
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
