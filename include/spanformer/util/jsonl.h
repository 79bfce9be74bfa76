// JSON Lines (one JSON value per line: log.jsonl, sessions.jsonl, eval.jsonl), read whole.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace spanformer {

// Every non-empty line of the file, in order, as a JSON array. A line that is not JSON is an Error
// naming the file and the line number, except the last line when `allow_cut_tail` is set (a log being
// appended to may end mid-record: that record is left out).
nlohmann::json read_jsonl(const std::string& path, bool allow_cut_tail = false);

}  // namespace spanformer
