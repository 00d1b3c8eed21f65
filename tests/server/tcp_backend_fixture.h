// The fixture of the shard's TCP data plane tests (tcp_backend_test.cc, tcp_tls_test.cc):
// a real shard, front and tcp::Backend on a loopback port, and a scripted worker that
// writes and reads frames with net/data_frame's encoders over a blocking socket, in
// plaintext or TLS.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "crypto/auth_proof.h"
#include "net/data_frame.h"
#include "server/shard.h"
#include "server/shard_front.h"
#include "server/transport/tcp/backend.h"
#include "tests/server/two_worker_shard.h"
#include "tests/support/data_port_client.h"

namespace ps::server::transport::tcp {

// A worker's end of a data connection, in blocking calls with a receive timeout, in
// plaintext or (StartTls) over TLS.
using Frame = testing::DataFrame;
using ScriptedWorker = testing::DataPortClient;

inline std::string Fp32(std::vector<float> values) {
  std::string payload;
  EXPECT_TRUE((*codecs::MakeCodec("fp32"))->Encode(values, &payload).ok());
  return payload;
}

inline uint64_t Refusals(const Shard& shard, Refusal r) {
  return shard.stats().refusals[static_cast<size_t>(r)];
}

// Waits up to 5 s for `done`.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

class TcpBackendTest : public ::testing::Test {
 protected:
  // The shared two-worker shard (tests/server/two_worker_shard.h) on the TCP plane.
  void SetUp() override {
    ServerOptions o;
    o.round_deadline = std::chrono::seconds(30);
    o.data_plane = core::DataPlane::kTcp;
    ps::testing::TwoWorkerShard made;
    ASSERT_NO_FATAL_FAILURE(ps::testing::MakeTwoWorkerShard(o, core::Clock::Real(), &pool_, &made));
    shard_ = std::move(made.shard);
    hash_ = made.hash;
    joins_ = std::move(made.joins);
    front_ = std::make_unique<ShardFront>(shard_.get(), nullptr, nullptr);
    options_.max_body_bytes = 1 << 20;
    options_.limits.proof_timeout = std::chrono::milliseconds(300);
    Configure(&options_);
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        Backend::Start(options_, front_.get(), core::Clock::Real());
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  // What a derived fixture changes in the backend's options before it starts.
  virtual void Configure(Options*) {}

  void TearDown() override {
    // The backend before the front, as in the server.
    if (backend_ != nullptr) backend_->Stop();
  }

  std::unique_ptr<ScriptedWorker> Admitted(uint32_t worker) {
    auto w = std::make_unique<ScriptedWorker>(backend_->port());
    EXPECT_TRUE(w->connected());
    absl::StatusOr<net::AdmitMeta> admit =
        w->Handshake(joins_[worker].data_session, worker, joins_[worker].data_secret);
    EXPECT_TRUE(admit.ok()) << admit.status();
    EXPECT_TRUE(w->server_proved());
    return w;
  }

  static std::string Push(uint64_t tag, uint64_t hash, uint64_t round, uint32_t slice,
                          const std::string& payload) {
    std::string out;
    EXPECT_TRUE(net::AppendPush(tag,
                                net::PushMeta{.layout_hash = hash, .round = round,
                                              .slice_id = slice, .codec = "fp32"},
                                payload.size(), &out)
                    .ok());
    return out + payload;
  }

  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardFront> front_;
  Options options_;
  std::unique_ptr<Backend> backend_;
  uint64_t hash_ = 0;
  std::vector<JoinResult> joins_;
};

}  // namespace ps::server::transport::tcp
