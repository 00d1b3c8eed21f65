// Client text (core/client_text.h): the UTF-8 check of text shown as it is.
#include "core/client_text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

namespace ps::core {
namespace {

std::string Bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

// The UTF-8 encoding of code point `cp` (RFC 3629, section 3), surrogates included.
std::string Encode(uint32_t cp) {
  if (cp < 0x80) return Bytes({static_cast<uint8_t>(cp)});
  if (cp < 0x800) {
    return Bytes({static_cast<uint8_t>(0xC0 | (cp >> 6)),
                  static_cast<uint8_t>(0x80 | (cp & 0x3F))});
  }
  if (cp < 0x10000) {
    return Bytes({static_cast<uint8_t>(0xE0 | (cp >> 12)),
                  static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)),
                  static_cast<uint8_t>(0x80 | (cp & 0x3F))});
  }
  return Bytes({static_cast<uint8_t>(0xF0 | (cp >> 18)),
                static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)),
                static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)),
                static_cast<uint8_t>(0x80 | (cp & 0x3F))});
}

TEST(ClientTextTest, EveryScalarValueIsUtf8AndNoSurrogate) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    ASSERT_EQ(IsUtf8(Encode(cp)), !surrogate) << std::hex << cp;
    // Inside text too, where a check that looked at the first sequence only would pass.
    ASSERT_EQ(IsUtf8("a" + Encode(cp) + "z"), !surrogate) << std::hex << cp;
  }
}

// Every two-byte string: valid exactly when it is two ASCII bytes or one two-byte
// encoding (of U+0080 to U+07FF; a shorter or longer sequence cannot fit).
TEST(ClientTextTest, EveryTwoByteStringAgreesWithTheEncoder) {
  std::set<std::string> two_byte;
  for (uint32_t cp = 0x80; cp < 0x800; ++cp) two_byte.insert(Encode(cp));
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const std::string s = Bytes({static_cast<uint8_t>(a), static_cast<uint8_t>(b)});
      const bool expected = (a < 0x80 && b < 0x80) || two_byte.contains(s);
      ASSERT_EQ(IsUtf8(s), expected) << a << " " << b;
    }
  }
}

TEST(ClientTextTest, IsUtf8RefusesMalformedSequences) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8(std::string("nul \0 inside", 12)));
  EXPECT_TRUE(IsUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e"));
  for (const std::string& bad : {
           Bytes({0x80}),                    // a continuation byte alone
           Bytes({0xBF, 0x41}),              //
           Bytes({0xC0, 0x80}),              // overlong NUL
           Bytes({0xC1, 0xBF}),              // overlong U+007F
           Bytes({0xE0, 0x9F, 0xBF}),        // overlong U+07FF
           Bytes({0xF0, 0x8F, 0xBF, 0xBF}),  // overlong U+FFFF
           Bytes({0xED, 0xA0, 0x80}),        // U+D800
           Bytes({0xED, 0xBF, 0xBF}),        // U+DFFF
           Bytes({0xF4, 0x90, 0x80, 0x80}),  // U+110000
           Bytes({0xF5, 0x80, 0x80, 0x80}),  //
           Bytes({0xFF}),                    //
           Bytes({0xC3}),                    // truncated at the end
           Bytes({0xE2, 0x82}),              //
           Bytes({0xF0, 0x9D, 0x84}),        //
           Bytes({0xC3, 0x41}),              // a continuation missing inside
           Bytes({0xE2, 0x41, 0xAC}),        //
           Bytes({0xE2, 0x82, 0x41}),        //
           Bytes({0xF0, 0x9D, 0x41, 0x9E}),  //
       }) {
    EXPECT_FALSE(IsUtf8(bad)) << static_cast<int>(static_cast<uint8_t>(bad[0]));
    EXPECT_FALSE(IsUtf8("ok " + bad)) << static_cast<int>(static_cast<uint8_t>(bad[0]));
  }
}

}  // namespace
}  // namespace ps::core
