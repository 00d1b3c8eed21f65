// TLS on the TCP data plane (docs/data-plane.md, "TLS."): a real tcp::Backend serving the
// test CA's shard-0 certificate and requiring client certificates of that CA (mTLS),
// against scripted workers (tcp_backend_fixture.h) and the worker library's TCP channel
// (worker_lib/transport/tcp/channel.h). What is refused and how it is counted: a
// plaintext worker, no client certificate, one of another CA, another worker's, a
// worker trusting another CA; and that a stalled TLS handshake ends at the proof
// timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/credentials.h"
#include "core/refusal.h"
#include "tcp_backend_fixture.h"
#include "tests/support/test_certs.h"
#include "worker_lib/transport/tcp/channel.h"

namespace ps::server::transport::tcp {
namespace {

using ::testing::HasSubstr;
using ::ps::internal::DataChannel;
using ::ps::internal::DataRoute;
using ::ps::internal::OutgoingPush;
using ::ps::internal::RpcClock;
using std::chrono::milliseconds;

// The test CA's certificates, and those of another CA that signed a worker-0 too.
const std::string& Certs() {
  static const std::string dir = ps::testing::MakeTestCerts("ps-tcp-tls", 1, 2);
  return dir;
}
const std::string& OtherCerts() {
  static const std::string dir = ps::testing::MakeTestCerts("ps-tcp-tls-other", 1, 1);
  return dir;
}
std::string Cert(const std::string& name) { return Certs() + "/" + name; }
std::string OtherCert(const std::string& name) { return OtherCerts() + "/" + name; }

std::string Pem(const std::string& path) {
  absl::StatusOr<std::string> text = core::ReadSmallFile(path, "test certificate");
  EXPECT_TRUE(text.ok()) << text.status();
  return text.value_or("");
}

class TcpTlsTest : public TcpBackendTest {
 protected:
  void Configure(Options* o) override {
    o->tls_cert_pem = Pem(Cert("shard-0.pem"));
    o->tls_key_pem = Pem(Cert("shard-0.key"));
    o->tls_ca_pem = Pem(Cert("ca.pem"));
  }

  uint64_t Closed(CloseReason reason) const {
    return backend_->stats().closed[static_cast<size_t>(reason)];
  }

  // A scripted worker through the TLS handshake with `cert` (a file of Certs(), or a path
  // when `other`), checking the shard against the test CA.
  std::unique_ptr<ScriptedWorker> Tls(const std::string& cert, const std::string& key) {
    auto w = std::make_unique<ScriptedWorker>(backend_->port());
    EXPECT_TRUE(w->connected());
    tls_error_ = w->StartTls(Cert("ca.pem"), cert, key);
    return w;
  }

  // The worker library's TCP channel to this backend as worker 0, with `credentials`.
  std::unique_ptr<DataChannel> Channel(core::ClientCredentials credentials) {
    absl::StatusOr<std::unique_ptr<DataChannel>> made = internal::tcp_plane::MakeTcpChannel(
        io_, internal::tcp_plane::TcpChannelOptions{
                 .worker_id = 0,
                 .shard = 0,
                 .address = "127.0.0.1:1",
                 .credentials = std::move(credentials),
                 .connect_timeout = milliseconds(5000)});
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return nullptr;
    EXPECT_TRUE((*made)
                    ->SetRoute(DataRoute{.epoch = 1,
                                         .plane = core::DataPlane::kTcp,
                                         .data_port = backend_->port(),
                                         .data_session = joins_[0].data_session,
                                         .data_secret = joins_[0].data_secret})
                    .ok());
    return *std::move(made);
  }

  // Worker 0's round-0 push of slice 0 through `channel`, and its answer.
  absl::Status PushOnce(DataChannel& channel) {
    OutgoingPush p;
    p.layout_hash = hash_;
    p.round = 0;
    p.slice_id = 0;
    p.codec = "fp32";
    p.payload = std::make_shared<const std::string>(Fp32({1, 2, 3, 4}));
    absl::Notification done;
    absl::Status status;
    std::unique_ptr<DataChannel::PushCall> call =
        channel.NewPush({&p}, RpcClock::now() + std::chrono::seconds(10));
    call->Start([&](size_t, absl::Status s) {
      status = std::move(s);
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    return status;
  }

  std::string tls_error_;
  std::shared_ptr<internal::tcp_plane::IoThread> io_ = internal::tcp_plane::StartIoThread();
};

TEST_F(TcpTlsTest, AWorkerWithItsCertificateIsAdmittedAndPushesInsideTls) {
  std::unique_ptr<ScriptedWorker> w = Tls(Cert("worker-0.pem"), Cert("worker-0.key"));
  ASSERT_EQ(tls_error_, "");
  // The data plane's own handshake still runs inside TLS.
  absl::StatusOr<net::AdmitMeta> admit =
      w->Handshake(joins_[0].data_session, 0, joins_[0].data_secret);
  ASSERT_TRUE(admit.ok()) << admit.status();
  EXPECT_TRUE(w->server_proved());
  ASSERT_TRUE(w->Send(Push(7, hash_, 0, 0, Fp32({1, 2, 3, 4}))));
  absl::StatusOr<Frame> answer = w->Read();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->header.type, net::FrameType::kAnswer);
  EXPECT_EQ(answer->header.tag, 7u);
  EXPECT_TRUE(ScriptedWorker::StatusOf(*answer).ok()) << ScriptedWorker::StatusOf(*answer);
  EXPECT_EQ(shard_->stats().pushes_accepted, 1u);
  EXPECT_EQ(backend_->stats().admitted, 1u);
}

TEST_F(TcpTlsTest, APlaintextWorkerIsDroppedAtTheTlsHandshakeWithoutWaiting) {
  ScriptedWorker w(backend_->port());
  ASSERT_TRUE(w.connected());
  net::HelloMeta hello{.data_session = joins_[0].data_session, .worker_id = 0};
  std::string out;
  ASSERT_TRUE(net::AppendHello(hello, &out).ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(w.Send(out));
  // Not a TLS record: closed at its header, well before the proof timeout (300 ms).
  EXPECT_TRUE(w.ClosedByShard());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(250));
  EXPECT_TRUE(Eventually([&] { return Closed(CloseReason::kTlsHandshake) == 1; }));
  EXPECT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
  EXPECT_EQ(Closed(CloseReason::kProofTimeout), 0u);
  EXPECT_EQ(backend_->stats().admitted, 0u);
}

TEST_F(TcpTlsTest, AWorkerWithoutACertificateIsRefused) {
  std::unique_ptr<ScriptedWorker> w = Tls("", "");
  // Under TLS 1.3 the client's side of the handshake ends before the shard checks its
  // certificate: the refusal comes instead of the CHALLENGE.
  if (tls_error_.empty()) {
    EXPECT_FALSE(w->Handshake(joins_[0].data_session, 0, joins_[0].data_secret).ok());
  }
  EXPECT_TRUE(Eventually([&] { return Closed(CloseReason::kTlsHandshake) == 1; }));
  EXPECT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
  EXPECT_EQ(backend_->stats().admitted, 0u);
}

TEST_F(TcpTlsTest, ACertificateOfAnotherCaIsRefused) {
  std::unique_ptr<ScriptedWorker> w = Tls(OtherCert("worker-0.pem"), OtherCert("worker-0.key"));
  if (tls_error_.empty()) {
    EXPECT_FALSE(w->Handshake(joins_[0].data_session, 0, joins_[0].data_secret).ok());
  }
  EXPECT_TRUE(Eventually([&] { return Closed(CloseReason::kTlsHandshake) == 1; }));
  EXPECT_EQ(backend_->stats().admitted, 0u);
  EXPECT_EQ(shard_->stats().pushes_accepted, 0u);
}

TEST_F(TcpTlsTest, AnotherWorkersCertificateCannotConnectUnderThisWorkersSession) {
  // worker-1's certificate is good, but the session is worker 0's: the identity is the
  // certificate's, as on the control plane.
  std::unique_ptr<ScriptedWorker> w = Tls(Cert("worker-1.pem"), Cert("worker-1.key"));
  ASSERT_EQ(tls_error_, "");
  absl::StatusOr<net::AdmitMeta> admit =
      w->Handshake(joins_[0].data_session, 0, joins_[0].data_secret);
  ASSERT_FALSE(admit.ok());
  EXPECT_EQ(admit.status().code(), absl::StatusCode::kPermissionDenied) << admit.status();
  EXPECT_THAT(admit.status().message(), HasSubstr("GOAWAY permission_denied"));
  EXPECT_THAT(admit.status().message(), HasSubstr("the client certificate says worker-1"));
  EXPECT_EQ(Refusals(*shard_, Refusal::kPermissionDenied), 1u);
  EXPECT_EQ(backend_->stats().admitted, 0u);
  // Its own session is fine.
  std::unique_ptr<ScriptedWorker> own = Tls(Cert("worker-1.pem"), Cert("worker-1.key"));
  ASSERT_EQ(tls_error_, "");
  EXPECT_TRUE(own->Handshake(joins_[1].data_session, 1, joins_[1].data_secret).ok());
}

TEST_F(TcpTlsTest, AStalledTlsHandshakeEndsAtTheProofTimeout) {
  // Half a ClientHello: a handshake record's header claiming 200 bytes, and 10 of them.
  const std::string partial("\x16\x03\x01\x00\xc8\x01\x00\x00\xc4\x03\x03\x00\x00\x00\x00", 15);
  ScriptedWorker silent(backend_->port()), stalled(backend_->port());
  ASSERT_TRUE(silent.connected());
  ASSERT_TRUE(stalled.connected());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(stalled.Send(partial));
  EXPECT_TRUE(stalled.ClosedByShard());
  EXPECT_TRUE(silent.ClosedByShard());
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(250));
  EXPECT_LT(took, milliseconds(3000));
  EXPECT_TRUE(Eventually([&] { return Closed(CloseReason::kProofTimeout) == 2; }));
  EXPECT_EQ(Closed(CloseReason::kTlsHandshake), 0u);
  EXPECT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
}

TEST_F(TcpTlsTest, TheWorkersChannelVerifiesTheShardAndPushesOverTls) {
  std::unique_ptr<DataChannel> channel = Channel(core::ClientCredentials{
      .tls_ca = Cert("ca.pem"), .tls_cert = Cert("worker-0.pem"), .tls_key = Cert("worker-0.key")});
  ASSERT_NE(channel, nullptr);
  const absl::Status pushed = PushOnce(*channel);
  EXPECT_TRUE(pushed.ok()) << pushed;
  EXPECT_EQ(shard_->stats().pushes_accepted, 1u);
}

TEST_F(TcpTlsTest, TheWorkersChannelConnectsAgainOverTlsAfterALoss) {
  std::unique_ptr<DataChannel> channel = Channel(core::ClientCredentials{
      .tls_ca = Cert("ca.pem"), .tls_cert = Cert("worker-0.pem"), .tls_key = Cert("worker-0.key")});
  ASSERT_NE(channel, nullptr);
  ASSERT_TRUE(PushOnce(*channel).ok());
  // A re-join replaces the session: the next push ends the connection (GOAWAY
  // unknown_session), then the channel dials again, TLS first, under the new one.
  absl::StatusOr<JoinResult> again = shard_->Join(0, hash_);
  ASSERT_TRUE(again.ok()) << again.status();
  const absl::Status refused = PushOnce(*channel);
  EXPECT_EQ(core::RefusalOf(refused), core::Refusal::kUnknownSession) << refused;
  ASSERT_TRUE(channel
                  ->SetRoute(DataRoute{.epoch = 2,
                                       .plane = core::DataPlane::kTcp,
                                       .data_port = backend_->port(),
                                       .data_session = again->data_session,
                                       .data_secret = again->data_secret})
                  .ok());
  const absl::Status pushed = PushOnce(*channel);
  EXPECT_EQ(core::RefusalOf(pushed), core::Refusal::kDuplicate) << pushed;
  EXPECT_EQ(backend_->stats().admitted, 2u);
}

TEST_F(TcpTlsTest, AWorkerTrustingAnotherCaFailsNamingTheVerification) {
  std::unique_ptr<DataChannel> channel = Channel(
      core::ClientCredentials{.tls_ca = OtherCert("ca.pem"),
                              .tls_cert = Cert("worker-0.pem"),
                              .tls_key = Cert("worker-0.key")});
  ASSERT_NE(channel, nullptr);
  const absl::Status pushed = PushOnce(*channel);
  EXPECT_EQ(pushed.code(), absl::StatusCode::kUnauthenticated) << pushed;
  EXPECT_THAT(pushed.message(), HasSubstr("shard 0"));
  EXPECT_THAT(pushed.message(), HasSubstr("certificate verify failed"));
  EXPECT_THAT(pushed.message(), HasSubstr(OtherCert("ca.pem")));
  EXPECT_EQ(shard_->stats().pushes_accepted, 0u);
}

TEST_F(TcpTlsTest, AWorkerDiallingANameTheCertificateLacksFails) {
  std::unique_ptr<DataChannel> channel = Channel(core::ClientCredentials{
      .tls_ca = Cert("ca.pem"),
      .tls_cert = Cert("worker-0.pem"),
      .tls_key = Cert("worker-0.key"),
      .tls_server_name = "somewhere-else.example"});
  ASSERT_NE(channel, nullptr);
  const absl::Status pushed = PushOnce(*channel);
  EXPECT_EQ(pushed.code(), absl::StatusCode::kUnauthenticated) << pushed;
  EXPECT_THAT(pushed.message(), HasSubstr("somewhere-else.example"));
}

TEST_F(TcpTlsTest, UnreadableWorkerTlsFilesFailWhenTheChannelIsMade) {
  absl::StatusOr<std::unique_ptr<DataChannel>> made = internal::tcp_plane::MakeTcpChannel(
      io_, internal::tcp_plane::TcpChannelOptions{
               .shard = 0,
               .address = "127.0.0.1:1",
               .credentials = {.tls_ca = Certs() + "/missing-ca.pem"}});
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(), HasSubstr("shard 0"));
  EXPECT_THAT(made.status().message(), HasSubstr("missing-ca.pem"));
}

}  // namespace
}  // namespace ps::server::transport::tcp
