// ps-bench: throughput benchmarks of ps-server's parts, each figure quoted as a ratio
// against a baseline measured in the same run (docs/bench.md).
//
//   ps-bench aggregators [--quick] [--n 8,16] [--d 2^20] [--threads 1,all] [--json FILE]
//   ps-bench codecs [--quick] [--codecs 'fp16;3lc(s=1.9)'] [--data gaussian|real|both]
//                   [--gradients FILE] [--json FILE]
//   ps-bench p3 [--quick] [--bandwidth 100,400] [--workers 2] [--json FILE]
//   ps-bench udp [--quick] [--loss 0,0.01,0.05,0.1] [--json FILE]
//   ps-bench e2e [--quick] [--workers 4] [--shards 2] [--params 2^22] [--codec fp32] [--json FILE]
//   ps-bench e2e --soak --workers 32 --seconds 300 [--json FILE]
//   ps-bench hostile [--quick] [--seconds 5] [--attacks layout_wrap,pull_leak] [--json FILE]
//   ps-bench auth [--quick] [--json FILE]
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/commands.h"
#include "cli/process_tuning.h"

int main(int argc, char** argv) {
  ps::cli::TuneProcessForThroughput();  // docs/data_path.md, "Allocator"
  CLI::App app{"ps-bench: throughput of ps-server's parts against a same-run baseline"};
  app.require_subcommand(1);
  std::vector<ps::bench::Command> commands;
  commands.push_back(ps::bench::AddAggregatorsCommand(app));
  commands.push_back(ps::bench::AddCodecsCommand(app));
  commands.push_back(ps::bench::AddP3Command(app));
  commands.push_back(ps::bench::AddUdpCommand(app));
  commands.push_back(ps::bench::AddE2eCommand(app));
  commands.push_back(ps::bench::AddHostileCommand(app));
  commands.push_back(ps::bench::AddAuthCommand(app));
  CLI11_PARSE(app, argc, argv);
  for (const ps::bench::Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return 2;
}
