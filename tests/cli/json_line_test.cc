#include "cli/json_line.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::cli {
namespace {

TEST(JsonObjectWriter, WritesScalarsInOrder) {
  JsonObjectWriter w;
  w.Add("event", "step").Add("step", uint64_t{12}).Add("loss", 0.25).Add("ok", true).AddNull("x");
  EXPECT_EQ(w.str(), R"({"event":"step","step":12,"loss":0.25,"ok":true,"x":null})");
  EXPECT_EQ(JsonObjectWriter().str(), "{}");
}

TEST(JsonObjectWriter, NonFiniteRealsBecomeNull) {
  JsonObjectWriter w;
  w.Add("a", std::numeric_limits<double>::quiet_NaN()).Add("b", -INFINITY);
  EXPECT_EQ(w.str(), R"({"a":null,"b":null})");
}

TEST(JsonQuote, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"), R"("a\"b\\c\nd\u0001")");
}

TEST(ParseFlatJson, ReadsWhatTheWriterWrites) {
  JsonObjectWriter w;
  w.Add("event", "done")
      .Add("steps", uint64_t{1000})
      .Add("final_test_accuracy", 0.8312)
      .Add("msg", "tab\there \"quoted\"")
      .Add("diverged", false)
      .AddNull("n");
  auto parsed = ParseFlatJson(w.str());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->String("event"), "done");
  EXPECT_EQ(parsed->Number("steps"), 1000.0);
  EXPECT_EQ(parsed->Number("final_test_accuracy"), 0.8312);
  EXPECT_EQ(parsed->String("msg"), "tab\there \"quoted\"");
  EXPECT_EQ(parsed->Bool("diverged"), false);
  EXPECT_TRUE(parsed->Has("n"));
  EXPECT_FALSE(parsed->Number("n").has_value());  // null is not a number
  EXPECT_FALSE(parsed->Number("event").has_value());
}

TEST(ParseFlatJson, AcceptsWhitespaceExponentsAndUnicodeEscapes) {
  auto parsed = ParseFlatJson(R"(  { "a" : -1.5e3 , "b":"\u00e9\ud83d\ude00", "c":0 }  )");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Number("a"), -1500.0);
  EXPECT_EQ(parsed->String("b"), "\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(parsed->Number("c"), 0.0);
}

TEST(ParseFlatJson, RejectsWhatIsNotAFlatObject) {
  for (const char* bad :
       {"", "[]", "{", "{\"a\":1,}", "{\"a\":{}}", "{\"a\":[1]}", "{\"a\":1} x", "{\"a\":01}",
        "{\"a\":1.}", "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}", "{\"a\":tru}", "{a:1}",
        "{\"a\":\"x\n\"}", "{\"a\":1e999}", "step 10 loss 0.3"}) {
    EXPECT_FALSE(ParseFlatJson(bad).ok()) << bad;
  }
}

TEST(ParseFlatJson, RejectsOverlongInput) {
  EXPECT_FALSE(ParseFlatJson(R"({"a":"0123456789"})", 10).ok());
}

}  // namespace
}  // namespace ps::cli
