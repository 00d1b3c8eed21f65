// The config-file grammar shared by ps-server's --config and ps-experiment's grids.
#include "core/config_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps::core {
namespace {

using ::testing::ElementsAre;

// Each entry of `text` as one line: "LINE KEY = VALUE", "LINE KEY = [A|B]" for an
// array, "LINE KEY: ERROR" for a refusal.
std::vector<std::string> Read(std::string_view text) {
  std::vector<std::string> out;
  for (const ConfigEntry& e : ReadConfigText(text)) {
    if (!e.error.empty()) {
      EXPECT_TRUE(e.values.empty()) << e.key;
      out.push_back(absl::StrCat(e.line, " ", e.key, ": ", e.error));
    } else if (e.array) {
      out.push_back(absl::StrCat(e.line, " ", e.key, " = [", absl::StrJoin(e.values, "|"), "]"));
    } else {
      EXPECT_EQ(e.values.size(), 1u) << e.key;
      out.push_back(absl::StrCat(e.line, " ", e.key, " = ", absl::StrJoin(e.values, "|")));
    }
  }
  return out;
}

TEST(ConfigTextTest, ReadsScalarsArraysAndComments) {
  EXPECT_THAT(Read("# a comment\n"
                   "\n"
                   "workers = 12  # trailing comment\n"
                   "model = \"cnn # not a comment\"\n"
                   "host = '127.0.0.1'\n"
                   "rules = [\"mean\", 'clip(2)+nnm', signflip, \"a, b\"]\n"
                   "pull_codec = topk(0.1, level=cat)\n"
                   "quiet = true\r\n"
                   "empty = \"\"\n"),
              ElementsAre("3 workers = 12", "4 model = cnn # not a comment",
                          "5 host = 127.0.0.1", "6 rules = [mean|clip(2)+nnm|signflip|a, b]",
                          "7 pull_codec = topk(0.1, level=cat)", "8 quiet = true", "9 empty = "));
}

TEST(ConfigTextTest, ArraysSpanLinesTakeATrailingCommaAndMayBeEmpty) {
  EXPECT_THAT(Read("peers = [\n"
                   "  \"ps-0:7070\",  # the first\n"
                   "  'ps-1:7070',\n"
                   "]\n"
                   "seeds = [1, 2,]\n"
                   "none = []\n"
                   "also_none = [ ]\n"
                   "after = 1\n"),
              ElementsAre("1 peers = [ps-0:7070|ps-1:7070]", "5 seeds = [1|2]", "6 none = []",
                          "7 also_none = []", "8 after = 1"));
}

TEST(ConfigTextTest, RefusesMalformedValuesNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"rules = [\"mean\"", "array without a closing ']'"},
      {"rules = [\"mean]", "unterminated string"},
      {"model = \"cnn", "unterminated string"},
      {"model = \"cnn\" x", "text after a closing quote"},
      {"model = c\"nn\"", "a quote inside a bare value"},
      {"workers =", "empty value"},
      {"seeds = [1,,2]", "empty value"},
      {"seeds = [,]", "empty value"},
      {"seeds = [\"1\" \"2\"]", "text after a closing quote"},
      {"seeds = [1, 2] 3", "text after the array's closing ']'"},
      {"seeds = [[1], [2]]", "an array inside an array is not supported"},
      {"seeds = [\n\"1\"\n\"2\"]", "expected ',' or ']' after an element"},
  };
  for (const auto& [text, error] : cases) {
    const std::string key = text.substr(0, text.find(' '));
    EXPECT_THAT(Read(text), ElementsAre(absl::StrCat("1 ", key, ": ", error))) << text;
  }
}

TEST(ConfigTextTest, RefusesTablesDottedKeysAndLinesWithoutAKey) {
  EXPECT_THAT(
      Read("[rounds]  # a table\n"
           "rounds.workers = 3\n"
           "lr  # no value\n"
           "= 3\n"
           "my key = 3\n"),
      ElementsAre("1 : table [rounds] is not supported: write flat keys (`key = value`)",
                  "2 rounds.workers: dotted keys are not supported: write flat keys (`key = value`)",
                  "3 : expected 'key = value', got 'lr'", "4 : expected 'key = value', got '= 3'",
                  "5 my key: a key is letters, digits, '_' and '-'"));
}

TEST(ConfigTextTest, ReadingGoesOnAfterARefusal) {
  EXPECT_THAT(Read("a = \"x\nb = [1,\n  2 \"3\"]\nc = 4\nd = [5\n"),
              ElementsAre("1 a: unterminated string", "2 b: a quote inside a bare value",
                          "4 c = 4", "5 d: array without a closing ']'"));
}

}  // namespace
}  // namespace ps::core
