// What the hostile-client suites (hostile_test.cc, hostile_rounds_test.cc) share: a real
// ps-server on loopback, authenticated the default way (its run directory), started
// through the harness (harness/server_process.h); the bound on its resident memory; the
// honest workers that train beside the attacks (harness/honest_training.h); and the
// sanitizer flags that decide which timing checks run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "auth_util.h"
#include "crypto/cluster_secret.h"
#include "core/layout.h"
#include "harness/honest_training.h"
#include "harness/process_stats.h"
#include "harness/server_process.h"
#include "ps/v1/ps.grpc.pb.h"
#include "tests/support/sanitized.h"
#include "worker_lib/worker.h"

namespace ps::testing {

// The bound asserted on a shard's resident memory: --max-shard-bytes (what its model
// state may take) plus what a shard needs beyond it (code, gRPC's buffers, threads).
inline constexpr uint64_t kMaxShardBytes = 256ull << 20;
// Under ASan or TSan the shard's own overhead (shadow memory, quarantine) is several
// times larger; the bound then only catches runaway growth.
inline constexpr uint64_t kRssBoundBytes =
    kMaxShardBytes + (PS_SANITIZED ? (2048ull << 20) : (128ull << 20));
// GCC's sanitizer builds, whose slowness the timing assertions allow for
// (tests/support/sanitized.h).
inline constexpr bool kGccSanitized = PS_GCC_SANITIZED;
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitized = true;
#else
inline constexpr bool kThreadSanitized = false;
#endif

// A ps-server process on loopback with --max-shard-bytes kMaxShardBytes, two threads,
// its run directory's tokens (--insecure instead when not `auth`) and `extra` flags; its
// output in a log file. Its data plane is gRPC unless `extra` names one (PlaneFlags):
// the hand-written clients here (workers(), peers()) speak ps.v1 on the control port.
class ShardProcess {
 public:
  explicit ShardProcess(std::vector<std::string> extra, bool auth = true) {
    absl::StatusOr<std::string> dir = harness::MakeTempDir("ps-hostile-run");
    EXPECT_TRUE(dir.ok()) << dir.status();
    run_dir_ = dir.value_or("");
    const std::string port_file = run_dir_ + ".port";
    std::vector<std::string> args = {"--port", "0", "--port-file", port_file,
                                     "--max-shard-bytes", std::to_string(kMaxShardBytes),
                                     "--threads", "2"};
    if (auth) {
      args.insert(args.end(), {"--run-dir", run_dir_});
    } else {
      args.push_back("--insecure");
    }
    if (std::find(extra.begin(), extra.end(), "--data-plane") == extra.end()) {
      args.insert(args.end(), {"--data-plane", "grpc"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<harness::ServerProcess>> server =
        harness::ServerProcess::Start(PS_SERVER_BINARY, args, run_dir_ + ".log");
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    absl::StatusOr<uint16_t> port = server_->WaitForPort(port_file, std::chrono::milliseconds(15000));
    EXPECT_TRUE(port.ok()) << port.status();
    std::filesystem::remove(port_file);
    port_ = port.ok() ? std::to_string(*port) : "";
    grpc::ChannelArguments ch;
    ch.SetMaxSendMessageSize(-1);
    ch.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), ch);
    workers_ = v1::WorkerService::NewStub(channel_);
    peers_ = v1::PeerService::NewStub(channel_);
  }
  ~ShardProcess() {
    server_.reset();  // kills and reaps it if it still runs
    std::error_code ignored;
    std::filesystem::remove_all(run_dir_, ignored);
    std::filesystem::remove(run_dir_ + ".log", ignored);
  }

  std::string address() const { return "127.0.0.1:" + port_; }
  std::string Token(uint32_t worker) const {
    absl::StatusOr<std::string> t = core::ReadTokenFile(
        crypto::TokenFilePath(run_dir_, core::Identity{core::Identity::Kind::kWorker, worker}));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.value_or("");
  }
  pid_t pid() const { return server_ != nullptr ? server_->pid() : -1; }
  uint64_t Resident() const { return harness::ResidentBytes(pid()); }
  bool Alive() { return server_ != nullptr && !server_->Exited(); }
  std::string Log() const { return server_ != nullptr ? server_->Log() : ""; }
  v1::WorkerService::Stub& workers() { return *workers_; }
  v1::PeerService::Stub& peers() { return *peers_; }

  grpc::Status Join(const std::string& token, uint32_t worker, uint64_t layout_hash,
                    std::string* session) {
    v1::JoinRequest req;
    req.set_worker_id(worker);
    req.set_layout_hash(layout_hash);
    v1::JoinResponse resp;
    grpc::Status s = workers_->Join(Context(address(), token).get(), req, &resp);
    if (session != nullptr) *session = resp.session();
    return s;
  }

  grpc::Status RegisterLayout(const std::string& token, const std::string& session,
                              const v1::Layout& layout,
                              std::chrono::milliseconds deadline = std::chrono::milliseconds(10000)) {
    v1::RegisterLayoutRequest req;
    req.set_session(session);
    *req.mutable_layout() = layout;
    v1::RegisterLayoutResponse resp;
    return workers_->RegisterLayout(Context(address(), token, deadline).get(), req, &resp);
  }

 private:
  std::string run_dir_;
  std::unique_ptr<harness::ServerProcess> server_;
  std::string port_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::PeerService::Stub> peers_;
};

// The honest workers' model: two tensors in slices of 8192.
inline const core::ModelLayout& HonestLayout() {
  static const core::ModelLayout layout =
      *core::ModelLayout::Create({{"a", 32768, 0}, {"b", 1024, 1}}, 8192, 1);
  return layout;
}

// Workers 0..n-1 training on `shard` until destroyed (harness::HonestTraining: pull t,
// push 0.01 everywhere, wait, t + 1); rounds are worker 0's, each counted once its
// pushes are answered. A worker that cannot start is a test failure.
class HonestTraining {
 public:
  HonestTraining(ShardProcess& shard, uint32_t n) {
    harness::HonestTrainingOptions o;
    o.address = shard.address();
    for (uint32_t w = 0; w < n; ++w) o.tokens.push_back(shard.Token(w));
    o.workers = n;
    o.init = 0.0f;
    o.gradient = [](uint32_t) { return 0.01f; };
    const WorkerOptions defaults;
    o.pull_timeout = std::chrono::milliseconds(10000);
    o.rpc_timeout = defaults.rpc_timeout;
    o.max_attempts = defaults.max_attempts;
    o.connect_timeout = std::chrono::milliseconds(20000);
    absl::StatusOr<std::unique_ptr<harness::HonestTraining>> t =
        harness::HonestTraining::Start(HonestLayout(), std::move(o));
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) training_ = *std::move(t);
  }

  uint64_t rounds() const { return training_ != nullptr ? training_->lead_rounds() : 0; }
  // Waits (bounded) until `more` rounds past now completed; false if they did not.
  bool AdvancesBy(uint64_t more, std::chrono::milliseconds within = std::chrono::milliseconds(20000)) {
    return training_ != nullptr && training_->AdvancesBy(more, within);
  }
  // Rounds per second over the next `period`.
  double RateOver(std::chrono::milliseconds period) {
    return training_ != nullptr ? training_->RateOver(period) : 0.0;
  }

 private:
  std::unique_ptr<harness::HonestTraining> training_;
};

}  // namespace ps::testing
