// Reading JSON the program did not just write itself: run logs (JSON Lines: log.jsonl, sessions.jsonl,
// eval.jsonl, read whole), configs, checkpoints' manifests, safetensors headers, Hugging Face configs.
// Every reader goes through parse_json: nlohmann's parser is iterative, but its serializer and our own
// walkers recurse, and a line nesting 100,000 arrays crashed `spanformer report`; no file of ours nests
// beyond a few levels, so 64 is the limit.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace spanformer {

constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse(text) that refuses text nesting deeper than kMaxJsonDepth levels with an Error
// "{what}: JSON nested deeper than 64 levels". Text that is not JSON throws nlohmann's exceptions, as
// parse does (callers name the file in their own message).
nlohmann::json parse_json(const std::string& text, const std::string& what);
// The same, but text that is not JSON gives a discarded value (parse(text, nullptr, false)).
nlohmann::json parse_json_or_discarded(const std::string& text, const std::string& what);
// The depth check for a parser callback of one's own: fails as above when depth > kMaxJsonDepth.
void check_json_depth(int depth, const std::string& what);

// Every non-empty line of the file, in order, as a JSON array. A line that is not JSON is an Error
// naming the file and the line number, except the last line when `allow_cut_tail` is set (a log being
// appended to may end mid-record: that record is left out).
nlohmann::json read_jsonl(const std::string& path, bool allow_cut_tail = false);

}  // namespace spanformer
