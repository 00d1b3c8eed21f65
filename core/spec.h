// The spec-string grammar shared by aggregators (--aggregator) and codecs (--codec):
// stages joined by '+', each a name with optional arguments in parentheses,
// "clip(2)+nnm+trimmed_mean", "topk(0.01)+bloom(p0, fpr=0.01)+fp16".
//
//   spec  = stage ('+' stage)*
//   stage = name ['(' [arg (',' arg)*] ')']      name: [a-z0-9][a-z0-9_]*
//   arg   = [key '='] value                       key: [a-z][a-z0-9_]*, value: [A-Za-z0-9_.+-]+
//
// Whitespace around tokens is ignored. ParseSpec() only splits; each stage binds and
// checks its own arguments with StageArgs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::core {

// One stage of a spec string as written: "clip(2)" -> {"clip", {{"", "2"}}}.
struct StageSpec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> args;  // key ("" if positional), value
};

// Splits a spec into stages. Refuses empty stages, unbalanced or nested parentheses,
// bad names and empty or malformed arguments, with a message that starts with `what`
// and quotes the spec: "aggregator spec 'clip(2': '(' without ')'".
absl::StatusOr<std::vector<StageSpec>> ParseSpec(std::string_view spec, std::string_view kind);

// A number as a canonical spec writes it: the shortest decimal that reads back as the
// same double (std::to_chars): "0.01", "1e-05", "0.9999999999999999" (six digits would
// print that as 1, which a parser of betas below 1 refuses).
std::string FormatNumber(double value);

// Reads a stage's arguments: each key at most once, positional arguments in the order
// of the keys the stage lists, and nothing unknown. Canonical() renders the stage back.
class StageArgs {
 public:
  // `keys`: the stage's argument names in positional order.
  static absl::StatusOr<StageArgs> Bind(const StageSpec& spec, std::vector<std::string> keys);
  bool Has(std::string_view key) const;
  // The value of `key` (or `fallback` when absent) as a finite number > min_exclusive.
  absl::StatusOr<double> Double(std::string_view key, double fallback, double min_exclusive) const;
  // The value of `key` (or `fallback`) as a decimal integer in [min, max].
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t fallback, int64_t min, int64_t max) const;
  // One of `choices`; returns its index, or `fallback` when absent.
  absl::StatusOr<size_t> Choice(std::string_view key, std::vector<std::string_view> choices,
                                size_t fallback) const;
  // "name" or "name(key=value, ...)" with the given arguments in key order.
  std::string Canonical() const;

 private:
  std::string name_;
  std::vector<std::string> keys_;
  std::vector<std::optional<std::string>> values_;  // per key
  const std::string* Find(std::string_view key) const;
};

}  // namespace ps::core
