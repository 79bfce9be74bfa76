// The local launcher behind `--nproc-per-node N` (torchrun's variables; dist/group.h reads them).
#pragma once
#include <string>
#include <vector>

namespace spanformer::dist {

// Spawns `n` local workers running this program with `args` (argv without the launcher flag) and the
// torchrun variables set; waits for them and returns the first failing exit status (0 if none). SIGINT,
// SIGTERM and SIGHUP are forwarded to the workers; a failed worker gets the others killed at once;
// workers die with the launcher (src/dist/launcher.cpp).
int spawn_local_workers(int n, const std::vector<std::string>& args);

// Where a worker started by spawn_local_workers puts its one-line error message instead of stderr
// (empty when this process is not such a worker). The launcher prints the first failed worker's
// message once, so a mistake every rank makes (a batch the group cannot split) is one line, not N + 1.
std::string worker_error_file();

}  // namespace spanformer::dist
