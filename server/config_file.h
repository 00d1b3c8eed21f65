// ps-server's configuration file and environment: the PS_* variable of a flag, and the
// TOML reader behind --config (flat keys only, a set PS_* variable wins over the file,
// some_name and some-name alike, unknown and repeated keys refused by name, arrays over
// several lines). Used by the flag parser (flags.cc, flags_table.cc); CLI11 types, so
// not a public header.
#pragma once

#include <istream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"

namespace ps::server {

// --some-name -> PS_SOME_NAME.
std::string EnvName(const std::string& long_name);

// The value of environment variable `name`; an unset and an empty variable both mean
// "not given" (CLI11 treats them alike).
std::optional<std::string> GetEnv(const std::string& name);

// The --config reader: the config-file grammar shared with ps-experiment
// (core/config_text.h: flat keys, arrays over several lines) in place of CLI11 2.1's
// own TOML reader, which reads arrays over lines only when their first element is on
// the key's line. It (a) makes a set PS_* variable win over the file, which CLI11 2.1
// does not do on its own (it reads the file first and then fills only options still
// unset from the environment), (b) accepts some_name as well as some-name, and
// (c) refuses malformed lines, tables, dotted keys, unknown keys and repeated keys with
// a message naming the line or the key. `keys` are the long flag names a file may set.
class ServerConfigReader final : public CLI::ConfigTOML {
 public:
  explicit ServerConfigReader(std::set<std::string> keys) : keys_(std::move(keys)) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

  // The items handed to the parser by the last from_config (to blame a bad value).
  const std::vector<CLI::ConfigItem>& used_items() const { return used_; }

 private:
  std::set<std::string> keys_;
  mutable std::vector<CLI::ConfigItem> used_;
};

}  // namespace ps::server
