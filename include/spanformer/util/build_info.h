// What this binary is: for `spanformer --version` and for the record each training session leaves in
// its run directory (so a figure can always be traced to the code, library and machine that made it).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace spanformer {

// "spanformer 0.1.0 (commit 3f2a9c1d0e4b), LibTorch 1.13.1, CUDA: not built in"
std::string version_line();

// {"version", "commit", "torch", "cuda"} as above, plus "host", "start" (UTC, ISO 8601) and "command"
// (the argument vector) when given.
nlohmann::json build_record(const std::vector<std::string>& command = {});

// The current time, UTC, ISO 8601 to the second: "2026-11-23T18:57:19Z".
std::string utc_timestamp();

}  // namespace spanformer
