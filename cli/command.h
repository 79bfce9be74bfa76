// The command registry of the `spanformer` tool: one file per command (cli/<name>.cpp), each a thin
// layer over the library that dispatches on the family of the config or checkpoint it is given
// (train/family.h). A command a family cannot serve says so in one line.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace spanformer::cli {

// Flags every command sees (before or after the command name).
struct Globals {
  int threads = 0;             // LibTorch CPU threads (0 = all cores)
  std::string device;  // empty: cpu (eval, generate, bench) or train.device (train)
  std::string attn_impl;       // adaptive span: auto | fused | plain ("" = the checkpoint's)
  std::vector<std::string> argv;  // for launchers that start copies of this program
};

using Run = std::function<void()>;  // the parsed command's action

struct Command {
  const char* name;
  void (*add)(CLI::App& app, const std::shared_ptr<Globals>& globals, Run& run);
};

// Every command, in help order.
const std::vector<Command>& commands();

void add_train(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_eval(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_generate(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_spans(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_bench(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_import(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_export(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_data(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_par(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_config(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_example(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_attention(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_translate(CLI::App&, const std::shared_ptr<Globals>&, Run&);
void add_report(CLI::App&, const std::shared_ptr<Globals>&, Run&);

// Shared by commands: --attn-impl as a config override list; the --nproc-per-node launcher (returns
// true in the launching process after the workers finished; exits with their status on failure).
std::vector<std::string> execution_overrides(const Globals& globals);
// The config overrides a command collected (its unknown options), "--key value" joined to "--key=value"
// (a value never starts with "--"; a command's positional arguments come before such pairs).
std::vector<std::string> config_overrides(const CLI::App& command);
bool launch_workers(int nproc, const std::vector<std::string>& argv);

// `COMMAND KIND FILE`: KIND must name a weight format (train/formats.h) and FILE be given. A first
// argument that is not a kind (a run directory, a file: the user left the kind out) is named in one usage
// line with the kinds.
void check_kind_and_file(const std::string& command, const std::string& kind, const std::string& file,
                         const std::string& file_role);

}  // namespace spanformer::cli
