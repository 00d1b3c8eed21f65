// The ps-bench subcommands. Each Add*Command registers its subcommand (flags and help)
// on `app` and returns how to run it once the command line has been parsed.
#pragma once

#include <functional>

#include "CLI/CLI.hpp"

namespace ps::bench {

struct Command {
  CLI::App* app = nullptr;   // the subcommand, owned by the parent app
  std::function<int()> run;  // the exit status
};

// The shards' --tcp-rto-min-ms on subcommand `sub` (`ps-bench e2e`, `udp`), into *ms
// (-1: auto, the default; 0: the kernel's; up to 200).
void AddTcpRtoMinOption(CLI::App* sub, int* ms);

// `ps-bench aggregators` (aggregators_bench.cc).
Command AddAggregatorsCommand(CLI::App& app);
// `ps-bench codecs` (codecs_bench.cc).
Command AddCodecsCommand(CLI::App& app);
// `ps-bench p3` (p3_bench.cc).
Command AddP3Command(CLI::App& app);
// `ps-bench udp` (udp_bench.cc).
Command AddUdpCommand(CLI::App& app);
// `ps-bench e2e` (e2e_bench.cc).
Command AddE2eCommand(CLI::App& app);
// `ps-bench hostile` (hostile_bench.cc).
Command AddHostileCommand(CLI::App& app);
// `ps-bench auth` (auth_bench.cc).
Command AddAuthCommand(CLI::App& app);

}  // namespace ps::bench
