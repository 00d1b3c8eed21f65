#include "server/logging.h"

#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A strict reader for the one shape we write: a flat object of string values.
// Returns nothing on any deviation from RFC 8259 for that shape (raw control
// characters, bad escapes, trailing bytes, ...).
class FlatJsonReader {
 public:
  static std::optional<std::map<std::string, std::string>> Parse(const std::string& text) {
    FlatJsonReader reader(text);
    std::map<std::string, std::string> out;
    if (!reader.Eat('{')) return std::nullopt;
    bool first = true;
    while (!reader.Eat('}')) {
      if (!first && !reader.Eat(',')) return std::nullopt;
      first = false;
      std::optional<std::string> key = reader.String();
      if (!key || !reader.Eat(':')) return std::nullopt;
      std::optional<std::string> value = reader.String();
      if (!value || !out.emplace(*key, *value).second) return std::nullopt;
    }
    if (reader.pos_ != text.size()) return std::nullopt;
    return out;
  }

 private:
  explicit FlatJsonReader(const std::string& text) : text_(text) {}

  bool Eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::optional<std::string> String() {
    if (!Eat('"')) return std::nullopt;
    std::string out;
    while (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_++]);
      if (c == '"') return out;
      if (c < 0x20) return std::nullopt;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (pos_ >= text_.size()) return std::nullopt;
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) return std::nullopt;
          uint32_t cp = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[pos_++];
            cp <<= 4;
            if (h >= '0' && h <= '9')
              cp |= static_cast<uint32_t>(h - '0');
            else if (h >= 'a' && h <= 'f')
              cp |= static_cast<uint32_t>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F')
              cp |= static_cast<uint32_t>(h - 'A' + 10);
            else
              return std::nullopt;
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return std::nullopt;
      }
    }
    return std::nullopt;
  }

  const std::string& text_;
  size_t pos_ = 0;
};

// "2024-05-01T12:00:00.123Z": digits where the template has 'd'. (No std::regex: GCC 12
// warns inside it under the sanitizers, and warnings are errors.)
bool IsTimestamp(const std::string& s) {
  const std::string pattern = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (s.size() != pattern.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool ok = pattern[i] == 'd' ? std::isdigit(static_cast<unsigned char>(s[i])) != 0
                                      : s[i] == pattern[i];
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class LoggingTest : public ::testing::Test {
 protected:
  std::shared_ptr<spdlog::logger> Make(const std::string& level, const std::string& format,
                                       const std::string& name = "shard-3") {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
        MakeLogger(level, format, name, {sink});
    EXPECT_TRUE(logger.ok()) << logger.status();
    return logger.ok() ? *logger : nullptr;
  }

  std::ostringstream out_;
};

TEST_F(LoggingTest, JsonLinesParseAndCarryTheFields) {
  auto logger = Make("info", "json");
  ASSERT_NE(logger, nullptr);
  logger->info("round {} closed with {} pushes", 7, 5);
  logger->warn("slow worker");
  logger->error("bad push");
  const std::vector<std::string> lines = Lines(out_.str());
  ASSERT_EQ(lines.size(), 3u) << out_.str();
  const std::vector<std::string> levels = {"info", "warn", "error"};
  const std::vector<std::string> msgs = {"round 7 closed with 5 pushes", "slow worker", "bad push"};
  for (size_t i = 0; i < lines.size(); ++i) {
    auto obj = FlatJsonReader::Parse(lines[i]);
    ASSERT_TRUE(obj.has_value()) << lines[i];
    EXPECT_EQ(obj->size(), 4u);
    EXPECT_TRUE(IsTimestamp((*obj)["ts"])) << (*obj)["ts"];
    EXPECT_EQ((*obj)["level"], levels[i]);
    EXPECT_EQ((*obj)["logger"], "shard-3");
    EXPECT_EQ((*obj)["msg"], msgs[i]);
  }
}

TEST_F(LoggingTest, JsonEscapesQuotesBackslashesAndControlCharacters) {
  auto logger = Make("trace", "json", "tag \"with\" quotes");
  ASSERT_NE(logger, nullptr);
  const std::string nasty = std::string("say \"hi\" C:\\path\\ line1\nline2\r\ttab \b\f") + '\x01' +
                            '\x1f' + "\x7f" + " caf\xc3\xa9 \xe2\x82\xac end";
  logger->info("{}", nasty);
  logger->debug("{}", "}{\",\"level\":\"error");
  const std::vector<std::string> lines = Lines(out_.str());
  ASSERT_EQ(lines.size(), 2u) << out_.str();  // the embedded newline was escaped
  auto obj = FlatJsonReader::Parse(lines[0]);
  ASSERT_TRUE(obj.has_value()) << lines[0];
  EXPECT_EQ((*obj)["msg"], nasty);
  EXPECT_EQ((*obj)["logger"], "tag \"with\" quotes");
  auto injected = FlatJsonReader::Parse(lines[1]);
  ASSERT_TRUE(injected.has_value()) << lines[1];
  EXPECT_EQ((*injected)["level"], "debug");
  EXPECT_EQ((*injected)["msg"], "}{\",\"level\":\"error");
}

TEST_F(LoggingTest, JsonReplacesInvalidUtf8) {
  auto logger = Make("info", "json");
  ASSERT_NE(logger, nullptr);
  // stray continuation, truncated sequence, overlong '/', UTF-16 surrogate
  logger->info("{}", std::string("a\x80 b\xe2\x82 c\xc0\xaf d\xed\xa0\x80 e"));
  const std::vector<std::string> lines = Lines(out_.str());
  ASSERT_EQ(lines.size(), 1u);
  auto obj = FlatJsonReader::Parse(lines[0]);
  ASSERT_TRUE(obj.has_value()) << lines[0];
  const std::string r = "\xef\xbf\xbd";  // U+FFFD
  EXPECT_EQ((*obj)["msg"], "a" + r + " b" + r + r + " c" + r + r + " d" + r + r + r + " e");
}

TEST(JsonEscapeTest, EscapesExactly) {
  std::string out;
  AppendJsonEscaped(std::string("a\"b\\c\nd\x01\x7f\xc3\xa9", 11), out);
  EXPECT_EQ(out, "a\\\"b\\\\c\\nd\\u0001\\u007f\xc3\xa9");
  out.clear();
  AppendJsonEscaped(std::string("\0x", 2), out);
  EXPECT_EQ(out, "\\u0000x");
}

TEST_F(LoggingTest, PlainLineHasTimestampLevelAndShardTag) {
  auto logger = Make("info", "plain");
  ASSERT_NE(logger, nullptr);
  logger->warn("disk {} full", "almost");
  const std::vector<std::string> lines = Lines(out_.str());
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_GT(lines[0].size(), 24u);
  EXPECT_TRUE(IsTimestamp(lines[0].substr(0, 24))) << lines[0];
  EXPECT_EQ(lines[0].substr(24), " warn  [shard-3] disk almost full");
}

TEST_F(LoggingTest, PlainLineEscapesControlCharacters) {
  auto logger = Make("info", "plain");
  ASSERT_NE(logger, nullptr);
  logger->info("{}", "peer said \"x\nFAKE error line\r\x1b[31m\" \\ \ttab");
  const std::vector<std::string> lines = Lines(out_.str());
  ASSERT_EQ(lines.size(), 1u) << out_.str();
  EXPECT_THAT(lines[0],
              HasSubstr("[shard-3] peer said \"x\\nFAKE error line\\r\\x1b[31m\" \\ \ttab"));
}

TEST_F(LoggingTest, LevelFiltersLowerMessages) {
  auto logger = Make("warn", "plain");
  ASSERT_NE(logger, nullptr);
  logger->debug("hidden");
  logger->info("hidden");
  logger->warn("shown");
  logger->error("shown too");
  const std::string text = out_.str();
  EXPECT_THAT(text, Not(HasSubstr("hidden")));
  EXPECT_EQ(Lines(text).size(), 2u);
}

TEST(LoggingConfigTest, RefusesUnknownLevelAndFormat) {
  absl::Status status = ConfigureLogging("verbose", "plain");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--log-level=verbose"));
  status = ConfigureLogging("info", "xml");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--log-format=xml"));
}

TEST(LoggingConfigTest, InstallsTheDefaultLoggerNamedAfterTheShard) {
  const std::shared_ptr<spdlog::logger> before = spdlog::default_logger();
  ServerOptions options;
  options.shard_id = 2;
  options.log_level = "debug";
  options.log_format = "json";
  ASSERT_TRUE(ConfigureLogging(options).ok());
  EXPECT_EQ(spdlog::default_logger()->name(), "shard-2");
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  ASSERT_TRUE(ConfigureLogging("error", "plain").ok());
  EXPECT_EQ(spdlog::default_logger()->name(), "ps-server");
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);
  spdlog::set_default_logger(before);
}

}  // namespace
}  // namespace ps::server
