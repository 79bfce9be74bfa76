// The `spanformer` command-line tool: thin commands over the library.
#pragma once
#include <CLI/CLI.hpp>

namespace spanformer::cli {

// Adds every subcommand to `app`; each one sets `run` to its action. argv is kept for launchers
// that start copies of this program (train --nproc-per-node).
void add_commands(CLI::App& app, std::function<void()>& run, int argc, char** argv);

}  // namespace spanformer::cli
