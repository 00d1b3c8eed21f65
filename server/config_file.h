// ps-server's configuration file and environment: the PS_* variable of a flag, and the
// TOML reader behind --config (flat keys only, a set PS_* variable wins over the file,
// some_name and some-name alike, unknown and repeated keys refused by name, arrays over
// several lines). Used by the flag parser (flags.cc); CLI11 types, so not a public header.
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

// TOML reader that (a) makes a set PS_* variable win over the file, which CLI11 2.1
// does not do on its own (it reads the file first and then fills only options still
// unset from the environment), (b) accepts some_name as well as some-name, and
// (c) refuses unknown keys, repeated keys and tables with a message naming the key,
// (d) reads arrays written over several lines (CLI11 2.1 does not). `keys` are the
// long flag names a file may set.
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
