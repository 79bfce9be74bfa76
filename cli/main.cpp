// spanformer: train, evaluate, sample from and look at adaptive-span language models.
// Every failure is one line on stderr ("spanformer: error: ...") and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <exception>

#include "commands.h"
#include "spanformer/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"spanformer: adaptive-span and long-context attention models on LibTorch"};
  app.require_subcommand(1);
  std::function<void()> run;
  spanformer::cli::add_commands(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (run) run();
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "spanformer: error: {}\n", spanformer::one_line_message(e));
    return 1;
  }
}
