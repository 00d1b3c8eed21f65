#include "core/config_text.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::core {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

void SkipBlanks(std::string_view line, size_t* i) {
  while (*i < line.size() && IsBlank(line[*i])) ++*i;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

// The text's lines, split at '\n', numbered from 1.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}

  bool Next(std::string_view* line) {
    if (pos_ > text_.size()) return false;
    const size_t end = std::min(text_.find('\n', pos_), text_.size());
    *line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++number_;
    return true;
  }
  size_t number() const { return number_; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  size_t number_ = 0;
};

// Reads the scalar at line[*i] into `value`: a quoted string, or bare text up to a
// comment (in an array: up to ',' or ']'). Leaves *i after it and the blanks that follow;
// false with `error` set when it is malformed.
bool ReadScalar(std::string_view line, size_t* i, bool in_array, std::string* value,
                std::string* error) {
  const auto ends_value = [&](char c) { return c == '#' || (in_array && (c == ',' || c == ']')); };
  SkipBlanks(line, i);
  if (*i < line.size() && (line[*i] == '"' || line[*i] == '\'')) {
    const size_t close = line.find(line[*i], *i + 1);
    if (close == std::string_view::npos) {
      *error = "unterminated string";
      return false;
    }
    *value = std::string(line.substr(*i + 1, close - *i - 1));
    *i = close + 1;
    SkipBlanks(line, i);
    if (*i < line.size() && !ends_value(line[*i])) {
      *error = "text after a closing quote";
      return false;
    }
    return true;
  }
  const size_t begin = *i;
  for (; *i < line.size() && !ends_value(line[*i]); ++*i) {
    if (line[*i] == '"' || line[*i] == '\'') {
      *error = "a quote inside a bare value";
      return false;
    }
  }
  *value = std::string(Trim(line.substr(begin, *i - begin)));
  if (value->empty()) {
    *error = "empty value";
    return false;
  }
  return true;
}

// Reads the array whose '[' is at line[*i] into `entry`, taking further lines from
// `lines` until its ']'; false with entry->error set when it is malformed.
bool ReadArray(Lines& lines, std::string_view line, size_t i, ConfigEntry* entry) {
  entry->array = true;
  ++i;  // '['
  bool after_element = false;
  for (;;) {
    SkipBlanks(line, &i);
    if (i == line.size() || line[i] == '#') {  // the array goes on on the next line
      if (!lines.Next(&line)) {
        entry->error = "array without a closing ']'";
        return false;
      }
      i = 0;
      continue;
    }
    if (line[i] == ']') break;
    if (after_element) {
      if (line[i] != ',') {
        entry->error = "expected ',' or ']' after an element";
        return false;
      }
      ++i;
      after_element = false;
      continue;
    }
    if (line[i] == '[') {
      entry->error = "an array inside an array is not supported";
      return false;
    }
    std::string value;
    if (!ReadScalar(line, &i, /*in_array=*/true, &value, &entry->error)) return false;
    entry->values.push_back(std::move(value));
    after_element = true;
  }
  ++i;  // ']'
  SkipBlanks(line, &i);
  if (i < line.size() && line[i] != '#') {
    entry->error = "text after the array's closing ']'";
    return false;
  }
  return true;
}

}  // namespace

std::vector<ConfigEntry> ReadConfigText(std::string_view text) {
  std::vector<ConfigEntry> entries;
  Lines lines(text);
  for (std::string_view line; lines.Next(&line);) {
    // A key holds no quotes, so the first '#' before a '=' starts a comment.
    const std::string_view code = Trim(line.substr(0, line.find('#')));
    if (code.empty()) continue;
    ConfigEntry& entry = entries.emplace_back();
    entry.line = lines.number();
    if (code.front() == '[') {
      entry.error = absl::StrCat("table ", AsAbsl(code),
                                 " is not supported: write flat keys (`key = value`)");
      continue;
    }
    const size_t eq = code.find('=');
    if (eq == std::string_view::npos || Trim(code.substr(0, eq)).empty()) {
      entry.error = absl::StrCat("expected 'key = value', got '", AsAbsl(code), "'");
      continue;
    }
    entry.key = std::string(Trim(code.substr(0, eq)));
    if (entry.key.find('.') != std::string::npos) {
      entry.error = "dotted keys are not supported: write flat keys (`key = value`)";
      continue;
    }
    if (!std::all_of(entry.key.begin(), entry.key.end(), IsKeyChar)) {
      entry.error = "a key is letters, digits, '_' and '-'";
      continue;
    }
    size_t i = line.find('=') + 1;
    SkipBlanks(line, &i);
    bool ok;
    if (i < line.size() && line[i] == '[') {
      ok = ReadArray(lines, line, i, &entry);
    } else {
      std::string value;
      ok = ReadScalar(line, &i, /*in_array=*/false, &value, &entry.error);
      if (ok) entry.values.push_back(std::move(value));
    }
    if (!ok) entry.values.clear();
  }
  return entries;
}

}  // namespace ps::core
