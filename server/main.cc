// ps-server: one shard of the parameter server. See `ps-server --help` and
// docs/configuration.md. SIGTERM or SIGINT: stop serving, drain, exit 0.
#include <csignal>
#include <cstdio>

#include "cli/process_tuning.h"
#include "server/flags.h"
#include "server/logging.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  ps::cli::TuneProcessForThroughput();  // docs/data_path.md, "Allocator"
  // Block the stop signals first, before any thread exists (threads inherit the mask),
  // and take them synchronously below, so no handler runs in the middle of gRPC and a
  // SIGTERM during start-up is not lost.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ps::server::FlagsResult flags = ps::server::ParseServerFlags(argc, argv);
  if (flags.exit_now) {
    std::fputs(flags.message.c_str(), flags.exit_code == 0 ? stdout : stderr);
    if (!flags.message.empty() && flags.message.back() != '\n') {
      std::fputc('\n', flags.exit_code == 0 ? stdout : stderr);
    }
    return flags.exit_code;
  }
  if (absl::Status st = ps::server::ConfigureLogging(flags.options);
      !st.ok()) {
    std::fprintf(stderr, "ps-server: %s\n", std::string(st.message()).c_str());
    return 2;
  }

  auto server = ps::server::Server::Start(flags.options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", std::string(server.status().message()));
    return 1;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown();
  server->reset();
  return 0;
}
