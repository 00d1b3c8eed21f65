// One-line JSON objects: the trainer's --progress jsonl events, the demo's summary and
// the benchmark rows.
//
// Only what those need: a writer for flat objects (string, integer, real, bool, null
// values; non-finite reals become null) and a parser for flat objects that rejects
// anything else (nesting, arrays, bad escapes, trailing bytes) with an error status.
// The parser reads another process's output, so it never trusts a length or recurses.
//
// Values are plain data; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::cli {

// Builds `{"key":value,...}` in insertion order.
class JsonObjectWriter {
 public:
  JsonObjectWriter& Add(std::string_view key, std::string_view value);
  JsonObjectWriter& Add(std::string_view key, const char* value) {
    return Add(key, std::string_view(value));
  }
  JsonObjectWriter& Add(std::string_view key, int64_t value);
  JsonObjectWriter& Add(std::string_view key, uint64_t value);
  JsonObjectWriter& Add(std::string_view key, int value) { return Add(key, int64_t{value}); }
  JsonObjectWriter& Add(std::string_view key, uint32_t value) { return Add(key, uint64_t{value}); }
  // Shortest text that reads back to the same double; NaN and infinities as null.
  JsonObjectWriter& Add(std::string_view key, double value);
  JsonObjectWriter& Add(std::string_view key, bool value);
  JsonObjectWriter& AddNull(std::string_view key);

  std::string str() const { return body_.empty() ? "{}" : body_ + "}"; }

 private:
  void Key(std::string_view key);

  std::string body_;
};

// `text` quoted and escaped as a JSON string.
std::string JsonQuote(std::string_view text);

// A scalar JSON value.
struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
};

// A flat JSON object: key -> scalar. A repeated key keeps the last value.
class FlatJson {
 public:
  std::map<std::string, JsonValue, std::less<>> fields;

  bool Has(std::string_view key) const { return fields.find(key) != fields.end(); }
  // The value when present with that type.
  std::optional<double> Number(std::string_view key) const;
  std::optional<std::string> String(std::string_view key) const;
  std::optional<bool> Bool(std::string_view key) const;
};

// Parses one flat object (surrounding whitespace allowed). At most `max_bytes` of input.
absl::StatusOr<FlatJson> ParseFlatJson(std::string_view line, size_t max_bytes = 1 << 16);

}  // namespace ps::cli
