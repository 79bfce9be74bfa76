// The local launcher behind `--nproc-per-node N` (torchrun's variables; dist/group.h reads them).
#pragma once
#include <string>
#include <vector>

namespace spanformer::dist {

// Spawns `n` local workers running this program with `args` (argv without the launcher flag) and the
// torchrun variables set; waits for them, stops the others when one fails, returns the exit status.
int spawn_local_workers(int n, const std::vector<std::string>& args);

}  // namespace spanformer::dist
