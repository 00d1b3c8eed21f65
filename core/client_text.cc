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

bool IsUtf8(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    // The lead byte gives the length; the ranges of the second byte below exclude the
    // overlong forms (E0 80-9F, F0 80-8F), the surrogates (ED A0-BF) and code points
    // above U+10FFFF (F4 90-BF), as RFC 3629's table does.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      return false;  // a continuation byte, C0/C1 (always overlong) or F5-FF
    }
    if (text.size() - i < len) return false;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace ps::core
