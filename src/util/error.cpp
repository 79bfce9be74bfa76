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
  return message.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace spanformer
