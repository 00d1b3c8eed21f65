// Command line of the ps-server daemon: flags (CLI11), PS_* environment variables and a
// TOML config file, merged into ServerOptions with the precedence
//   flag > environment variable > config file > default.
// Every flag --some-name has the variable PS_SOME_NAME and the config key some-name
// (some_name is accepted too). docs/configuration.md lists them all.
//
// Pure functions over argv and the process environment (getenv, plus gethostname for
// --shard-id=-1); they never exit the process and never throw. Not thread-safe against
// a concurrent setenv.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/options.h"

namespace ps::server {

// What the caller of ParseServerFlags should do next.
struct FlagsResult {
  // Parsed, resolved (shard id) and validated options; meaningful when !exit_now.
  ServerOptions options;
  // True for --help and --version (exit_code 0, message to print on stdout) and for
  // every error (exit_code 2, message to print on stderr).
  bool exit_now = false;
  int exit_code = 0;
  // Help text, version line or error message (names the flag, key or variable).
  std::string message;
};

// Parses argv[1..argc) together with the PS_* environment and the --config file (or
// PS_CONFIG), resolves --shard-id=-1 from the host name, and validates the result.
FlagsResult ParseServerFlags(int argc, const char* const* argv);

// The shard id in a host name ending in "-N" (a Kubernetes StatefulSet pod such as
// "ps-server-3", also as "ps-server-3.ps-server.ns.svc"); an error naming the host
// when there is no numeric suffix.
absl::StatusOr<int> ShardIdFromHostname(std::string_view hostname);

// "ps-server <version>", as printed by --version.
std::string ServerVersionString();

}  // namespace ps::server
