#include "core/client_text.h"

#include "absl/strings/str_cat.h"

namespace ps::core {

std::string ClientText(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 24);
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  }
  if (text.size() > max_bytes) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

}  // namespace ps::core
