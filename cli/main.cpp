// spanformer: train, evaluate, sample from and look at attention language models of every family
// (cli/command.h has the command registry; one file per command).
// Every failure is one line on stderr ("spanformer: error: ...") and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <exception>
#include <string>
#include <vector>

#include "command.h"
#include "spanformer/dist/launcher.h"
#include "spanformer/train/family.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/usage.h"

namespace {
// LibTorch's OpenMP threads spin for a long time after each parallel region, and on a small machine
// they then steal the cores OpenBLAS's own threads need for the next matrix product: measured on the
// 2-core machine, bench_small at span 40 takes 872 ms/step by default and 485 ms/step with a short spin
// (docs/benchmarks.md). libgomp reads GOMP_SPINCOUNT only when it is loaded, so the setting is made by
// re-executing once with it in the environment (unless the user chose a policy).
void use_short_openmp_spin(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
  setenv("GOMP_SPINCOUNT", "10000", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

// Global flags may follow the command (`spanformer train -c x.json --threads 1`): they are moved in
// front of it before parsing, so every command reads them alike. "--" ends the moving.
const char* const kGlobalFlags[] = {"--threads", "--device", "--attn-impl"};

bool is_global_flag(const std::string& a, bool& takes_next) {
  for (const char* g : kGlobalFlags) {
    const std::string flag = g;
    if (a == flag || a.rfind(flag + "=", 0) == 0) {
      takes_next = a == flag;
      return true;
    }
  }
  return false;
}

std::vector<std::string> hoist_global_flags(int argc, char** argv) {
  std::vector<std::string> front{argv[0]}, rest;
  bool command_seen = false, moving = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool takes_next = false;
    if (moving && is_global_flag(a, takes_next)) {
      front.push_back(a);
      if (takes_next && i + 1 < argc) front.emplace_back(argv[++i]);
      continue;
    }
    if (a == "--") moving = false;
    if (!command_seen && a.rfind('-', 0) != 0) command_seen = true;
    (command_seen ? rest : front).push_back(a);
  }
  front.insert(front.end(), rest.begin(), rest.end());
  return front;
}

// The first argument that is neither a global flag nor its value: the command as typed ("" if none).
std::string typed_command(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    bool takes_next = false;
    if (is_global_flag(args[i], takes_next)) {
      i += takes_next ? 1 : 0;
      continue;
    }
    return args[i].rfind('-', 0) == 0 ? "" : args[i];
  }
  return "";
}
// Options that name a file or directory, in every command: an empty value (`--out ''`) would mean the
// working directory or, joined with a file name, the root ("/train.bin"), so it is refused at parsing.
void refuse_empty_paths(CLI::App& app) {
  static const std::vector<std::string> kPathOptions = {"out", "data", "config", "init", "file", "vocab", "ids",
                                                        "dump-logprobs", "dump-outputs", "profile", "spans-from"};
  const CLI::Validator non_empty(
      [](std::string& value) { return value.empty() ? std::string("a path, and empty") : std::string(); }, "PATH",
      "NonEmptyPath");
  for (CLI::Option* option : app.get_options())
    for (const auto& name : kPathOptions)
      if (option->check_lname(name)) option->check(non_empty);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_paths(*sub);
}
// The one error line: on stderr, or, in a worker of the --nproc-per-node launcher, into the file the
// launcher reads, which prints the first failed worker's line once (src/dist/launcher.cpp).
// SPANFORMER_PARENT_PID=N (set by the Python package for the programs it runs): this program's life is
// tied to that process's. When it ends (killed, crashed), the kernel sends this one SIGUSR1
// (PR_SET_PDEATHSIG), whose handler points stdout and stderr at /dev/null (the parent's pipe has no
// reader any more: a write there would fail or kill) and sends SIGTERM, which a training run takes as a
// stop (its checkpoint saved, the run directory's lock released) and any other command as the end. A
// parent already gone is the end.
int g_devnull = -1;

void on_parent_death(int) {
  ::dup2(g_devnull, STDOUT_FILENO);  // async-signal-safe, as is kill
  ::dup2(g_devnull, STDERR_FILENO);
  ::kill(::getpid(), SIGTERM);
}

void follow_parent() {
  const char* text = std::getenv("SPANFORMER_PARENT_PID");
  if (!text || !*text) return;
  char* end = nullptr;
  const long parent = std::strtol(text, &end, 10);
  const bool valid = *end == '\0' && parent > 0;
  ::unsetenv("SPANFORMER_PARENT_PID");  // for this process only: the workers of --nproc-per-node have their own
  if (!valid) return;
  g_devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (g_devnull < 0) return;
  ::signal(SIGUSR1, on_parent_death);
  ::prctl(PR_SET_PDEATHSIG, SIGUSR1);
  if (::getppid() != static_cast<pid_t>(parent)) {  // it ended before the line above
    std::fprintf(stderr, "spanformer: error: the process that started this one (pid %ld) has ended\n", parent);
    std::exit(1);
  }
}

void report_error(const std::string& message) {
  const std::string line = fmt::format("spanformer: error: {}\n", message);
  if (const std::string file = spanformer::dist::worker_error_file(); !file.empty()) {
    std::ofstream out(file, std::ios::app);
    if (out << line << std::flush) return;
  }
  fmt::print(stderr, "{}", line);
}
// --device reaches the commands that run a model on it; anywhere else it would be ignored without a word,
// and a device that does not exist is refused before any work.
void check_device_flag(CLI::App& app, const std::string& device) {
  if (device.empty()) return;
  static const std::set<std::string> kOnDevice = {"train", "eval", "bench", "generate", "translate"};
  const auto parsed = app.get_subcommands();
  const std::string command = parsed.empty() ? "" : parsed.front()->get_name();
  if (command.empty() || kOnDevice.count(command) > 0) {
    spanformer::train::parse_device(device);  // the name, and the device present
    return;
  }
  if (spanformer::train::device_named(device).is_cpu()) return;
  spanformer::fail("--device {}: `{}` runs on the CPU (--device is for train, eval, bench, generate and translate)",
                   device, command);
}

}  // namespace

int main(int argc, char** argv) {
  use_short_openmp_spin(argv);
  follow_parent();
  spanformer::keep_freed_memory();
  try {  // SPANFORMER_CPU_HALF_PRODUCTS, read before any command so that a bad value is a usage error
    spanformer::check_environment();
  } catch (const std::exception& e) {
    report_error(spanformer::one_line_message(e));
    return 2;
  }
  CLI::App app{"spanformer: adaptive-span and long-context attention models on LibTorch"};
  app.require_subcommand(1);
  spanformer::cli::Run run;
  auto globals = std::make_shared<spanformer::cli::Globals>();
  const auto args = hoist_global_flags(argc, argv);
  globals->argv = args;
  app.set_version_flag("--version", [] { return spanformer::version_line(); }, "version, git commit, LibTorch, CUDA");
  app.add_option("--threads", globals->threads, "CPU threads for LibTorch (default: OMP_NUM_THREADS if set, else all cores)");
  app.add_option("--device", globals->device, "cpu | cuda | cuda:N (default cpu; for train it sets train.device)");
  app.add_option("--attn-impl", globals->attn_impl,
                 "adaptive span: auto | fused | plain, how attention is computed (default: the checkpoint's or config's)");
  for (const auto& command : spanformer::cli::commands()) command.add(app, globals, run);
  refuse_empty_paths(app);
  std::vector<std::string> names;
  for (const auto& command : spanformer::cli::commands()) names.emplace_back(command.name);
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);  // CLI11 reads from the back
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    const std::string typed = typed_command(args);
    if (!typed.empty() && std::find(names.begin(), names.end(), typed) == names.end()) {
      fmt::print(stderr, "spanformer: error: unknown command '{}'{} (--help lists the commands)\n", typed,
                 spanformer::did_you_mean(typed, names));
      return 2;
    }
    // A command with commands of its own (config, data, par): the word after it, named with a guess.
    if (CLI::App* top = typed.empty() ? nullptr : app.get_subcommand(typed)) {
      std::vector<std::string> subs;
      for (const CLI::App* sub : top->get_subcommands([](CLI::App*) { return true; })) subs.push_back(sub->get_name());
      const auto at = std::find(args.begin(), args.end(), typed);
      const std::string next = at != args.end() && at + 1 != args.end() ? *(at + 1) : "";
      if (!subs.empty() && std::find(subs.begin(), subs.end(), next) == subs.end() && next.rfind('-', 0) != 0) {
        if (next.empty())
          fmt::print(stderr, "spanformer: error: {} needs one of its commands: {}\n", typed, fmt::join(subs, ", "));
        else
          fmt::print(stderr, "spanformer: error: unknown {} command '{}'{} ({}: {})\n", typed, next,
                     spanformer::did_you_mean(next, subs), typed, fmt::join(subs, ", "));
        return 2;
      }
    }
    fmt::print(stderr, "spanformer: error: {} (--help lists the options)\n", spanformer::one_line_message(e));
    return 2;
  }
  try {
    check_device_flag(app, globals->device);
    if (run) run();
    // Results written to a full or closed stdout are lost: say so and fail instead of exiting 0.
    std::cout.flush();
    if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))
      spanformer::fail("cannot write the results to standard output (closed or full)");
    return 0;
  } catch (const spanformer::UsageError& e) {
    report_error(spanformer::one_line_message(e));
    return 2;
  } catch (const std::exception& e) {
    report_error(spanformer::one_line_message(e));
    return 1;
  }
}
