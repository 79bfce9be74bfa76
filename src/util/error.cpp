#include "spanformer/util/error.h"

#include <c10/util/Exception.h>

#include "spanformer/util/torch_compat.h"

namespace spanformer {

std::string one_line_message(const std::exception& e) {
  std::string message;
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    message = compat::error_message(*c10_error);
  } else {
    message = e.what();
  }
  // LibTorch messages may span several lines; keep the informative first non-empty one.
  size_t start = message.find_first_not_of("\n ");
  if (start == std::string::npos) return "unknown error";
  size_t end = message.find('\n', start);
  message = message.substr(start, end == std::string::npos ? std::string::npos : end - start);
  // nlohmann::json prefixes its messages with "[json.exception.<kind>.<id>] ": not for users.
  if (message.rfind("[json.exception.", 0) == 0)
    if (size_t close = message.find("] "); close != std::string::npos) message = message.substr(close + 2);
  return message;
}

}  // namespace spanformer
