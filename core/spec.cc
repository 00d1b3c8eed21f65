#include "core/spec.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace ps::core {
namespace {


std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// [a-z][a-z0-9_]*, or with a leading digit too when `digit_first` ("3lc").
bool IsWord(std::string_view s, bool digit_first = false) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '_')) {
      return false;
    }
  }
  const auto first = static_cast<unsigned char>(s.front());
  return std::islower(first) != 0 || (digit_first && std::isdigit(first) != 0);
}

bool IsValue(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
          c == '+')) {
      return false;
    }
  }
  return true;
}

absl::Status SpecError(std::string_view kind, std::string_view spec, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(AsAbsl(kind), " '", AsAbsl(spec), "': ", AsAbsl(what)));
}

}  // namespace

absl::StatusOr<std::vector<StageSpec>> ParseSpec(std::string_view spec, std::string_view kind) {
  // Split on '+' outside parentheses ('+' inside may be a number's sign: 1e+3).
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < spec.size(); ++i) {
    const char c = spec[i];
    if (c == '(') {
      if (++depth > 1) return SpecError(kind, spec, "nested parentheses");
    } else if (c == ')') {
      if (--depth < 0) return SpecError(kind, spec, "')' without '('");
    } else if (c == '+' && depth == 0) {
      parts.push_back(spec.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) return SpecError(kind, spec, "'(' without ')'");
  parts.push_back(spec.substr(start));

  std::vector<StageSpec> stages;
  for (std::string_view raw : parts) {
    std::string_view part = Trim(raw);
    if (part.empty()) return SpecError(kind, spec, "empty stage (two '+' in a row, or one at an end)");
    StageSpec stage;
    const size_t open = part.find('(');
    stage.name = std::string(Trim(part.substr(0, open)));
    if (!IsWord(stage.name, /*digit_first=*/true)) {
      return SpecError(kind, spec, absl::StrCat("bad stage name '", stage.name,
                                          "' (lower-case letters, digits and '_')"));
    }
    if (open != std::string_view::npos) {
      if (part.back() != ')') {
        return SpecError(kind, spec, absl::StrCat("text after ')' in stage '", AsAbsl(part), "'"));
      }
      std::string_view inside = Trim(part.substr(open + 1, part.size() - open - 2));
      if (!inside.empty()) {
        size_t pos = 0;
        while (pos <= inside.size()) {
          size_t comma = inside.find(',', pos);
          if (comma == std::string_view::npos) comma = inside.size();
          std::string_view arg = Trim(inside.substr(pos, comma - pos));
          std::string key;
          std::string_view value = arg;
          if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
            key = std::string(Trim(arg.substr(0, eq)));
            value = Trim(arg.substr(eq + 1));
            if (!IsWord(key)) {
              return SpecError(kind, spec, absl::StrCat("bad argument name '", key, "' in stage '",
                                                  stage.name, "'"));
            }
          }
          if (!IsValue(value)) {
            return SpecError(kind, spec, absl::StrCat("bad or empty argument '", AsAbsl(arg),
                                                "' in stage '", stage.name, "'"));
          }
          stage.args.emplace_back(std::move(key), std::string(value));
          pos = comma + 1;
        }
      }
    }
    stages.push_back(std::move(stage));
  }
  return stages;
}

absl::StatusOr<StageArgs> StageArgs::Bind(const StageSpec& spec, std::vector<std::string> keys) {
  StageArgs args;
  args.name_ = spec.name;
  args.keys_ = std::move(keys);
  args.values_.assign(args.keys_.size(), std::nullopt);
  size_t positional = 0;
  bool named_seen = false;
  for (const auto& [key, value] : spec.args) {
    size_t index = args.keys_.size();
    if (key.empty()) {
      if (named_seen) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.name, ": positional argument '", value, "' after a named one"));
      }
      if (positional >= args.keys_.size()) {
        return absl::InvalidArgumentError(
            args.keys_.empty()
                ? absl::StrCat(spec.name, " takes no arguments, got '", value, "'")
                : absl::StrCat(spec.name, " takes at most ", args.keys_.size(),
                               " arguments (", absl::StrJoin(args.keys_, ", "), "), got '",
                               value, "' too"));
      }
      index = positional++;
    } else {
      named_seen = true;
      for (size_t i = 0; i < args.keys_.size(); ++i) {
        if (args.keys_[i] == key) index = i;
      }
      if (index == args.keys_.size()) {
        return absl::InvalidArgumentError(
            args.keys_.empty()
                ? absl::StrCat(spec.name, " takes no arguments, got '", key, "'")
                : absl::StrCat(spec.name, ": unknown argument '", key, "' (known: ",
                               absl::StrJoin(args.keys_, ", "), ")"));
      }
    }
    if (args.values_[index].has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.name, ": argument '", args.keys_[index], "' given twice"));
    }
    args.values_[index] = value;
  }
  return args;
}

const std::string* StageArgs::Find(std::string_view key) const {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key && values_[i].has_value()) return &*values_[i];
  }
  return nullptr;
}

bool StageArgs::Has(std::string_view key) const { return Find(key) != nullptr; }

absl::StatusOr<double> StageArgs::Double(std::string_view key, double fallback,
                                         double min_exclusive) const {
  const std::string* text = Find(key);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const double v = std::strtod(text->c_str(), &end);
  if (end != text->c_str() + text->size() || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", AsAbsl(key), " = '", *text,
                                                   "' is not a finite number"));
  }
  if (!(v > min_exclusive)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": ", AsAbsl(key), " must be > ", min_exclusive, ", got ", *text));
  }
  return v;
}

absl::StatusOr<int64_t> StageArgs::Int(std::string_view key, int64_t fallback, int64_t min,
                                       int64_t max) const {
  const std::string* text = Find(key);
  if (text == nullptr) return fallback;
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || ptr != text->data() + text->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": ", AsAbsl(key), " = '", *text, "' is not an integer"));
  }
  if (v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", AsAbsl(key), " must lie in [",
                                                   min, ", ", max, "], got ", v));
  }
  return v;
}

absl::StatusOr<size_t> StageArgs::Choice(std::string_view key,
                                         std::vector<std::string_view> choices,
                                         size_t fallback) const {
  const std::string* text = Find(key);
  if (text == nullptr) return fallback;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i] == *text) return i;
  }
  std::vector<std::string> names(choices.begin(), choices.end());
  return absl::InvalidArgumentError(absl::StrCat(name_, ": ", AsAbsl(key), " = '", *text,
                                                 "' is not one of ", absl::StrJoin(names, ", ")));
}

std::string FormatNumber(double value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(value);
}

std::string StageArgs::Canonical() const {
  std::vector<std::string> given;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (values_[i].has_value()) given.push_back(absl::StrCat(keys_[i], "=", *values_[i]));
  }
  if (given.empty()) return name_;
  return absl::StrCat(name_, "(", absl::StrJoin(given, ", "), ")");
}

}  // namespace ps::core
