#include "spanformer/util/jsonl.h"

#include <fmt/format.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer {

void check_json_depth(int depth, const std::string& what) {
  if (depth > kMaxJsonDepth) fail("{}: JSON nested deeper than {} levels", what, kMaxJsonDepth);
}

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  return nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    check_json_depth(depth, what);
    return true;
  });
}

nlohmann::json parse_json_or_discarded(const std::string& text, const std::string& what) {
  return nlohmann::json::parse(
      text,
      [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        check_json_depth(depth, what);
        return true;
      },
      /*allow_exceptions=*/false);
}

nlohmann::json read_jsonl(const std::string& path, bool allow_cut_tail) {
  nlohmann::json rows = nlohmann::json::array();
  const std::string text = read_file(path);
  size_t start = 0, line = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line;
    const std::string row = text.substr(start, end - start);
    start = end + 1;
    if (row.empty()) continue;
    auto value = parse_json_or_discarded(row, fmt::format("{} line {}", path, line));
    if (value.is_discarded()) {
      if (allow_cut_tail && start >= text.size()) break;
      fail("{} line {} is not JSON", path, line);
    }
    rows.push_back(std::move(value));
  }
  return rows;
}

}  // namespace spanformer
