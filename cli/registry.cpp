#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>

#include "command.h"
#include "spanformer/dist/launcher.h"
#include "spanformer/train/formats.h"
#include "spanformer/util/error.h"
#include "spanformer/util/usage.h"

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

void check_kind_and_file(const std::string& command, const std::string& kind, const std::string& file,
                         const std::string& file_role) {
  const auto kinds = train::weight_format_names();  // train/formats.h
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
    fail_usage("{}: '{}' is not a kind of weights ({}){}: spanformer {} KIND {} --out FILE", command, kind,
               fmt::format("{}", fmt::join(kinds, ", ")), did_you_mean(kind, kinds), command, file_role);
  if (file.empty())
    fail_usage("{}: give the {} after the kind: spanformer {} {} {} --out FILE", command, file_role, command, kind,
               file_role);
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
