#include "spanformer/util/jsonl.h"

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer {

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
    auto value = nlohmann::json::parse(row, nullptr, false);
    if (value.is_discarded()) {
      if (allow_cut_tail && start >= text.size()) break;
      fail("{} line {} is not JSON", path, line);
    }
    rows.push_back(std::move(value));
  }
  return rows;
}

}  // namespace spanformer
