// What the flag parser of ps-server (flags.cc) takes from the flag table (flags_table.cc):
// DefineFlags, which declares every flag, the raw values some flags parse into, and
// ApplyRawFlagValues, which stores those in their ServerOptions fields after the parse.
// CLI11 types, so not a public header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/options.h"

namespace ps::server {

// Fields that are stored with another type than the flag parses into.
struct RawFlagValues {
  int64_t round_deadline_ms = 0;
  int64_t tcp_rto_min_ms = 0;
  int64_t drain_timeout_ms = 0;
  int64_t peer_timeout_ms = 0;
  int64_t checkpoint_interval_s = 0;
  int64_t max_connection_idle_ms = 0;
  int64_t connection_proof_timeout_ms = 0;
  int64_t request_read_timeout_ms = 0;
  int64_t refusal_hold_ms = 0;
  int64_t quarantine_ms = 0;
  int64_t worker_timeout_ms = 0;
  // Choices parsed into their enums once the flags are read (each checked by its flag).
  std::string schedule, aggregation_scope, device, krum_neighbours, even_median, data_plane;
};

// Declares every flag of ps-server on `app`, bound to `options` and `raw`. Returns the
// long names of the configurable ones (= config keys; PS_ + upper snake = variables).
// `with_env` is off for the scratch parsers that check a single value.
std::vector<std::string> DefineFlags(CLI::App& app, ServerOptions& o, RawFlagValues& raw,
                                     bool with_env);

// After a parse: the fields of `o` that the flags of `raw` set (durations from their
// integers, choices from their names).
void ApplyRawFlagValues(const RawFlagValues& raw, ServerOptions& o);

}  // namespace ps::server
