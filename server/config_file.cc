#include "server/config_file.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps::server {
namespace {

// The text of `line` before a '#' that is not inside a quoted string.
std::string_view StripComment(std::string_view line) {
  char quote = '\0';
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != '\0') {
      if (c == quote) quote = '\0';
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return std::string_view();
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

// CLI11 2.1 reads an array that spans lines only when its first element is on the
// key's line, and keeps an empty element for a trailing comma. Rewrites every array
// value onto one line without the trailing comma so that the usual TOML layouts
//   peers = [
//     "ps-0:7070",
//     "ps-1:7070",
//   ]
// work. Other lines pass through unchanged.
std::string NormalizeArrays(std::istream& input) {
  std::string out;
  for (std::string line; std::getline(input, line);) {
    std::string_view code = Trim(StripComment(line));
    const size_t eq = code.find('=');
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view() : Trim(code.substr(eq + 1));
    if (value.empty() || value.front() != '[') {
      absl::StrAppend(&out, line, "\n");
      continue;
    }
    std::string joined(code);
    for (std::string next; joined.find(']') == std::string::npos && std::getline(input, next);) {
      absl::StrAppend(&joined, " ", std::string(Trim(StripComment(next))));
    }
    if (const size_t close = joined.rfind(']'); close != std::string::npos) {
      size_t before = joined.find_last_not_of(" \t", close == 0 ? 0 : close - 1);
      if (before != std::string::npos && joined[before] == ',') joined.erase(before, 1);
    }
    absl::StrAppend(&out, joined, "\n");
  }
  return out;
}

}  // namespace

std::string EnvName(const std::string& long_name) {
  std::string env = absl::StrCat("PS_", long_name);
  for (char& c : env) c = c == '-' ? '_' : absl::ascii_toupper(static_cast<unsigned char>(c));
  return env;
}

std::optional<std::string> GetEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::vector<CLI::ConfigItem> ServerConfigReader::from_config(std::istream& input) const {
  std::istringstream normalized(NormalizeArrays(input));
  std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(normalized);
  std::vector<CLI::ConfigItem> kept;
  std::set<std::string> seen;
  for (CLI::ConfigItem& item : items) {
    if (!item.parents.empty()) {
      const std::string where = item.name == "++" || item.name == "--"
                                    ? absl::StrCat("table [", absl::StrJoin(item.parents, "."), "]")
                                    : absl::StrCat("dotted key \"", item.fullname(), "\"");
      throw CLI::ConfigError(
          absl::StrCat(where, " is not supported: write flat keys such as `workers = 6`"));
    }
    std::replace(item.name.begin(), item.name.end(), '_', '-');
    if (keys_.count(item.name) == 0) {
      throw CLI::ConfigError(absl::StrCat("unknown key \"", item.name,
                                          "\" (keys are the long flag names, see --help)"));
    }
    if (!seen.insert(item.name).second) {
      throw CLI::ConfigError(absl::StrCat("key \"", item.name, "\" is given more than once"));
    }
    if (GetEnv(EnvName(item.name)).has_value()) continue;  // the environment wins
    // `peers = []`: CLI11 would demand a value; an empty list is the default anyway.
    if (item.inputs.empty()) continue;
    kept.push_back(std::move(item));
  }
  used_ = kept;
  return kept;
}

}  // namespace ps::server
