// spanformer: train, evaluate, sample from and look at attention language models of every family
// (cli/command.h has the command registry; one file per command).
// Every failure is one line on stderr ("spanformer: error: ...") and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <exception>

#include "command.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"

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
}  // namespace

int main(int argc, char** argv) {
  use_short_openmp_spin(argv);
  spanformer::keep_freed_memory();
  CLI::App app{"spanformer: adaptive-span and long-context attention models on LibTorch"};
  app.require_subcommand(1);
  spanformer::cli::Run run;
  auto globals = std::make_shared<spanformer::cli::Globals>();
  globals->argv.assign(argv, argv + argc);
  app.set_version_flag("--version", [] { return spanformer::version_line(); }, "version, git commit, LibTorch, CUDA");
  app.add_option("--threads", globals->threads, "CPU threads for LibTorch (default: all cores)");
  app.add_option("--device", globals->device, "cpu | cuda | cuda:N (default cpu; for train it sets train.device)");
  app.add_option("--attn-impl", globals->attn_impl,
                 "adaptive span: auto | fused | plain, how attention is computed (default: the checkpoint's or config's)");
  for (const auto& command : spanformer::cli::commands()) command.add(app, globals, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    fmt::print(stderr, "spanformer: error: {} (--help lists the options)\n", spanformer::one_line_message(e));
    return 2;
  }
  try {
    if (run) run();
    // Results written to a full or closed stdout are lost: say so and fail instead of exiting 0.
    std::cout.flush();
    if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))
      spanformer::fail("cannot write the results to standard output (closed or full)");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "spanformer: error: {}\n", spanformer::one_line_message(e));
    return 1;
  }
}
