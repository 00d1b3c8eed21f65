#include "server/config_file.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/config_text.h"

namespace ps::server {

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
  const std::string text{std::istreambuf_iterator<char>(input), std::istreambuf_iterator<char>()};
  std::vector<CLI::ConfigItem> kept;
  std::set<std::string> seen;
  for (core::ConfigEntry& entry : core::ReadConfigText(text)) {
    if (!entry.error.empty()) {
      throw CLI::ConfigError(absl::StrCat(
          "line ", entry.line, entry.key.empty() ? "" : absl::StrCat(", key \"", entry.key, "\""),
          ": ", entry.error));
    }
    CLI::ConfigItem item;
    item.name = std::move(entry.key);
    item.inputs = std::move(entry.values);
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
