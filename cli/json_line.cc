#include "cli/json_line.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps::cli {

std::string JsonQuote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out.push_back(kHex[(c >> 4) & 0xf]);
          out.push_back(kHex[c & 0xf]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

void JsonObjectWriter::Key(std::string_view key) {
  body_.push_back(body_.empty() ? '{' : ',');
  body_ += JsonQuote(key);
  body_.push_back(':');
}

JsonObjectWriter& JsonObjectWriter::Add(std::string_view key, std::string_view value) {
  Key(key);
  body_ += JsonQuote(value);
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Add(std::string_view key, int64_t value) {
  Key(key);
  absl::StrAppend(&body_, value);
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Add(std::string_view key, uint64_t value) {
  Key(key);
  absl::StrAppend(&body_, value);
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Add(std::string_view key, double value) {
  Key(key);
  if (!std::isfinite(value)) {
    body_ += "null";
    return *this;
  }
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  body_.append(buffer, result.ptr);
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Add(std::string_view key, bool value) {
  Key(key);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObjectWriter& JsonObjectWriter::AddNull(std::string_view key) {
  Key(key);
  body_ += "null";
  return *this;
}

std::optional<double> FlatJson::Number(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end() || it->second.type != JsonValue::Type::kNumber) return std::nullopt;
  return it->second.number;
}

std::optional<std::string> FlatJson::String(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end() || it->second.type != JsonValue::Type::kString) return std::nullopt;
  return it->second.text;
}

std::optional<bool> FlatJson::Bool(std::string_view key) const {
  auto it = fields.find(key);
  if (it == fields.end() || it->second.type != JsonValue::Type::kBool) return std::nullopt;
  return it->second.boolean;
}

namespace {

// Recursive-descent reader over one flat object; `pos_` only moves forward.
class Parser {
 public:
  explicit Parser(std::string_view in) : in_(in) {}

  absl::StatusOr<FlatJson> Object() {
    FlatJson out;
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    SkipSpace();
    if (!Eat('}')) {
      while (true) {
        SkipSpace();
        auto key = String();
        if (!key.ok()) return key.status();
        SkipSpace();
        if (!Eat(':')) return Error("expected ':'");
        SkipSpace();
        auto value = Value();
        if (!value.ok()) return value.status();
        out.fields[*std::move(key)] = *std::move(value);
        SkipSpace();
        if (Eat(',')) continue;
        if (Eat('}')) break;
        return Error("expected ',' or '}'");
      }
    }
    SkipSpace();
    if (pos_ != in_.size()) return Error("trailing bytes");
    return out;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("json: ", what, " at byte ", pos_));
  }
  bool Eat(char c) {
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool EatWord(std::string_view word) {
    if (in_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }
  void SkipSpace() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::StatusOr<JsonValue> Value() {
    JsonValue v;
    if (pos_ >= in_.size()) return Error("missing value");
    const char c = in_[pos_];
    if (c == '"') {
      auto s = String();
      if (!s.ok()) return s.status();
      v.type = JsonValue::Type::kString;
      v.text = *std::move(s);
    } else if (EatWord("true")) {
      v.type = JsonValue::Type::kBool;
      v.boolean = true;
    } else if (EatWord("false")) {
      v.type = JsonValue::Type::kBool;
    } else if (EatWord("null")) {
      v.type = JsonValue::Type::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      auto n = Number();
      if (!n.ok()) return n.status();
      v.type = JsonValue::Type::kNumber;
      v.number = *n;
    } else {
      return Error("unsupported value (only flat objects of scalars)");
    }
    return v;
  }

  bool Digits() {
    const size_t start = pos_;
    while (pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }

  absl::StatusOr<double> Number() {
    const size_t start = pos_;
    Eat('-');
    if (Eat('0')) {
      // No leading zeros.
    } else if (!Digits()) {
      return Error("bad number");
    }
    if (Eat('.') && !Digits()) return Error("bad fraction");
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!Digits()) return Error("bad exponent");
    }
    double value = 0;
    const auto result = std::from_chars(in_.data() + start, in_.data() + pos_, value);
    if (result.ec == std::errc::result_out_of_range) return Error("number out of range");
    if (result.ec != std::errc() || result.ptr != in_.data() + pos_) return Error("bad number");
    return value;
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (in_.size() - pos_ < 4) return Error("short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = in_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return Error("bad \\u escape");
    }
    return v;
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  absl::StatusOr<std::string> String() {
    if (!Eat('"')) return Error("expected a string");
    std::string out;
    while (true) {
      if (pos_ >= in_.size()) return Error("unterminated string");
      const char c = in_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= in_.size()) return Error("unterminated escape");
      const char e = in_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          auto hi = Hex4();
          if (!hi.ok()) return hi.status();
          uint32_t cp = *hi;
          if (cp >= 0xdc00 && cp <= 0xdfff) return Error("lone low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (!EatWord("\\u")) return Error("lone high surrogate");
            auto lo = Hex4();
            if (!lo.ok()) return lo.status();
            if (*lo < 0xdc00 || *lo > 0xdfff) return Error("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (*lo - 0xdc00);
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
  }

  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<FlatJson> ParseFlatJson(std::string_view line, size_t max_bytes) {
  if (line.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("json: line of ", line.size(), " bytes exceeds ", max_bytes));
  }
  return Parser(line).Object();
}

}  // namespace ps::cli
