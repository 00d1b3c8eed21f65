// Security (docs/operations.md, "Securing"): token and mTLS identities on real gRPC servers on loopback. A
// client without credentials, a worker joining under another worker's id, and a worker
// replaying another worker's push are refused with precise statuses, counted, and the
// honest round completes. TLS and mTLS run on each data plane (the TCP plane's port serves
// the same certificates).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "auth_util.h"
#include "cluster_util.h"
#include "codecs/codec.h"
#include "core/credentials.h"
#include "net/grpc_credentials.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "ps/v1/ps.grpc.pb.h"
#include "tests/support/test_certs.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

// Certificates and tokens for 1 shard and 3 workers, made once per test binary.
const std::filesystem::path& Certs() {
  static const std::filesystem::path dir = testing::MakeTestCerts("ps_security_test", 1, 3);
  return dir;
}

std::string Token(const std::string& identity) {
  absl::StatusOr<std::string> t = core::ReadTokenFile((Certs() / ("token-" + identity)).string());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : std::string();
}

std::string Path(const std::string& name) { return (Certs() / name).string(); }

size_t Refused(server::Server& s, server::Refusal r) {
  return s.shard().stats().refusals[static_cast<size_t>(r)];
}

using testing::Context;

// One unary call to the shard at `address` with the proof of `token` (none when empty),
// or the reason no proof could be made.
template <typename F>
grpc::Status Call(const std::string& address, const std::string& token, F&& call) {
  return testing::Auth(address, token)
      .Unary(std::chrono::system_clock::now() + std::chrono::seconds(10),
             /*wait_for_ready=*/false, std::forward<F>(call));
}

class TokenSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ServerOptions o;
    o.data_plane = core::DataPlane::kGrpc;  // the impostors push through ps.v1 stubs
    o.num_workers = 3;
    o.num_byzantine = 1;  // quorum 2: the two honest workers close the round
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.round_deadline = milliseconds(300);
    o.threads = 2;
    o.tokens_file = Path("tokens");
    cluster_ = testing::StartCluster(1, o);
    ASSERT_EQ(cluster_.num_shards(), 1u);
    layout_ = std::make_unique<core::ModelLayout>(*core::ModelLayout::Create({{"w", 4, 0}}, 128, 1));
    stub_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(cluster_.addresses()[0], grpc::InsecureChannelCredentials()));
  }

  server::Server& shard() { return cluster_.shard(0); }

  grpc::Status Join(const std::string& token, uint32_t worker_id, std::string* session) {
    v1::JoinRequest req;
    req.set_worker_id(worker_id);
    req.set_layout_hash(layout_->hash());
    v1::JoinResponse resp;
    grpc::Status s = Call(cluster_.addresses()[0], token,
                          [&](grpc::ClientContext* ctx) { return stub_->Join(ctx, req, &resp); });
    if (s.ok() && session != nullptr) *session = resp.session();
    return s;
  }

  grpc::Status Push(const std::string& token, const v1::PushRequest& req) {
    v1::PushResponse resp;
    return Call(cluster_.addresses()[0], token,
                [&](grpc::ClientContext* ctx) { return stub_->Push(ctx, req, &resp); });
  }

  testing::Cluster cluster_;
  std::unique_ptr<core::ModelLayout> layout_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

TEST_F(TokenSecurityTest, ImpostorsAreRefusedAndTheHonestRoundCompletes) {
  // Worker 0: the worker library with its token. It registers the layout.
  WorkerOptions wo;
  wo.shard_addresses = cluster_.addresses();
  wo.worker_id = 0;
  wo.credentials.token = Token("worker-0");
  auto honest = Worker::Start(wo, *layout_);
  ASSERT_TRUE(honest.ok()) << honest.status();

  // Without credentials: UNAUTHENTICATED, before anything else is looked at.
  grpc::Status s = Join("", 1, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("credentials required"));
  s = Join(std::string(32, 'x'), 1, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown token"));

  // Worker 2's token joining as worker 1: the id comes from the credentials.
  s = Join(Token("worker-2"), 1, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("worker-2 may not join as worker 1"));

  // Worker 1 (raw, honest) joins and pushes round 0.
  std::string session1;
  ASSERT_TRUE(Join(Token("worker-1"), 1, &session1).ok());
  v1::PushRequest push1;
  push1.set_session(session1);
  push1.set_layout_hash(layout_->hash());
  push1.set_round(0);
  push1.set_slice_id(0);
  push1.set_codec("fp32");
  const std::vector<float> g1 = {1, 2, 3, 4};
  ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(g1, push1.mutable_payload()).ok());
  ASSERT_TRUE(Push(Token("worker-1"), push1).ok());

  // Worker 2 replays worker 1's push (its session included) under its own token, and
  // without any: refused, and not counted as worker 1's or anyone's push.
  s = Push(Token("worker-2"), push1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("belongs to worker-1, not to worker-2"));
  EXPECT_EQ(Push("", push1).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Worker 1 itself sending it again is a duplicate.
  EXPECT_EQ(Push(Token("worker-1"), push1).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  // The honest round: mean of workers 0 and 1 (worker 2 never pushed).
  const std::vector<float> g0 = {3, 2, 1, 0};
  ASSERT_TRUE((*honest)->Push(0, 0, g0).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  std::vector<float> out(4);
  absl::StatusOr<uint64_t> v = (*honest)->Pull(0, 1, out, milliseconds(20000));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1u);
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[i], (g0[i] + g1[i]) / 2) << i;

  EXPECT_GE(Refused(shard(), server::Refusal::kUnauthenticated), 3u);
  EXPECT_GE(Refused(shard(), server::Refusal::kPermissionDenied), 2u);
  EXPECT_EQ(shard().shard().stats().pushes_accepted, 2u);
}

TEST_F(TokenSecurityTest, AdministrativeCallsNeedTheAdminIdentity) {
  auto admin = v1::AdminService::NewStub(
      grpc::CreateChannel(cluster_.addresses()[0], grpc::InsecureChannelCredentials()));
  v1::StatusResponse resp;
  const std::string& address = cluster_.addresses()[0];
  grpc::Status s =
      admin->Status(Context(address, Token("worker-0")).get(), v1::StatusRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = admin->Status(Context(address, Token("admin")).get(), v1::StatusRequest(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.num_shards(), 1u);
  // No --checkpoint-dir: a precise refusal, not a crash.
  v1::CheckpointResponse ck;
  s = admin->Checkpoint(Context(address, Token("admin")).get(), v1::CheckpointRequest(), &ck);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("--checkpoint-dir"));
}

TEST(RateLimitTest, AClientOverItsRateIsRefusedOthersAreNot) {
  server::ServerOptions o;
  o.data_plane = core::DataPlane::kGrpc;  // its calls are ps.v1 stubs
  o.num_workers = 2;
  o.aggregate_only = true;
  o.rate_limit = 1;
  o.rate_burst = 2;
  o.tokens_file = Path("tokens");
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(c.addresses()[0], grpc::InsecureChannelCredentials()));
  auto join = [&](const std::string& identity, uint32_t id) {
    v1::JoinRequest req;
    req.set_worker_id(id);
    v1::JoinResponse resp;
    return stub->Join(Context(c.addresses()[0], Token(identity)).get(), req, &resp).error_code();
  };
  int exhausted = 0;
  for (int i = 0; i < 10; ++i) exhausted += join("worker-1", 1) == grpc::StatusCode::RESOURCE_EXHAUSTED;
  EXPECT_GE(exhausted, 1);
  EXPECT_LE(exhausted, 8);
  // Another identity has its own bucket (its join goes on to the next check, the
  // missing layout hash).
  EXPECT_EQ(join("worker-0", 0), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(c.shard(0).shard().stats().refusals[static_cast<size_t>(server::Refusal::kRateLimited)],
            static_cast<uint64_t>(exhausted));
}

// One aggregate-only shard for one worker, serving mTLS with the test certificates, its
// tensors on `plane` (the TCP plane's port serves TLS with the same certificates).
server::ServerOptions MutualTlsShard(core::DataPlane plane = core::DataPlane::kGrpc) {
  server::ServerOptions o;
  o.num_workers = 1;
  o.aggregate_only = true;
  o.tls_cert = Path("shard-0.pem");
  o.tls_key = Path("shard-0.key");
  o.tls_ca = Path("ca.pem");
  o.data_plane = plane;
  return o;
}

// TLS and mTLS on each data plane (testing::DataPlanes()).
class TlsPlaneTest : public ::testing::TestWithParam<core::DataPlane> {
 protected:
  // Worker 0, trusting the test CA with `credentials`, completes a round on the one shard
  // of `c` (layout "w" of 3), its tensors on the plane (a TCP shard refuses them over
  // gRPC): it pushes `g` and pulls it back.
  void RoundOnThePlane(const testing::Cluster& c, core::ClientCredentials credentials,
                       const std::vector<float>& g) {
    WorkerOptions wo;
    wo.shard_addresses = c.addresses();
    wo.worker_id = 0;
    wo.credentials = std::move(credentials);
    wo.credentials.tls_ca = Path("ca.pem");
    const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 3, 0}}, 128, 1);
    auto w = Worker::Start(wo, layout);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->shards()[0].data_plane, GetParam());
    ASSERT_TRUE((*w)->Push(0, 0, g).ok());
    std::vector<float> out(3);
    ASSERT_TRUE((*w)->Pull(0, 1, out, milliseconds(20000)).ok());
    EXPECT_EQ(out, g);
  }
};

INSTANTIATE_TEST_SUITE_P(Planes, TlsPlaneTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

TEST_P(TlsPlaneTest, WorkerIdComesFromTheCertificate) {
  server::ServerOptions o = MutualTlsShard(GetParam());
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  auto layout = *core::ModelLayout::Create({{"w", 3, 0}}, 128, 1);

  // The honest worker with its certificate completes a round.
  RoundOnThePlane(
      c, {.tls_cert = Path("worker-0.pem"), .tls_key = Path("worker-0.key")}, {1, -1, 0.5f});

  // worker-1's certificate cannot join as worker 0.
  core::ClientCredentials other;
  other.tls_ca = Path("ca.pem");
  other.tls_cert = Path("worker-1.pem");
  other.tls_key = Path("worker-1.key");
  auto other_creds = net::MakeChannelCredentials(other);
  ASSERT_TRUE(other_creds.ok()) << other_creds.status();
  auto stub = v1::WorkerService::NewStub(grpc::CreateChannel(c.addresses()[0], *other_creds));
  v1::JoinRequest req;
  req.set_worker_id(0);
  req.set_layout_hash(layout.hash());
  v1::JoinResponse resp;
  grpc::Status s = stub->Join(Context().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("worker-1 may not join as worker 0"));

  // A plaintext client does not get through the TLS handshake at all.
  auto plain = v1::WorkerService::NewStub(
      grpc::CreateChannel(c.addresses()[0], grpc::InsecureChannelCredentials()));
  auto ctx = Context();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  EXPECT_FALSE(plain->Join(ctx.get(), req, &resp).ok());
}

// Server TLS without client certificates: the worker proves its token, inside TLS, on
// both ports.
TEST_P(TlsPlaneTest, ATokenWorkerOverServerTlsCompletesARound) {
  server::ServerOptions o = MutualTlsShard(GetParam());
  o.tls_ca.clear();
  o.tokens_file = Path("tokens");
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  RoundOnThePlane(c, {.token = Token("worker-0")}, {2, 0, -2});
}

// A shard with both a cluster secret (its run directory) and a token file: each worker
// keys its data session with the token it proved at its Join, and the shard binds the
// session to that token. Worker 0 holds its token file's token, worker 1 the token the
// secret derives; each completes a round on the plane, then one over UDP (a shard keying
// worker 0 with the derived token fails the TCP handshake and drops its datagrams as
// forged).
class TokenPlaneTest : public ::testing::TestWithParam<core::DataPlane> {};

INSTANTIATE_TEST_SUITE_P(Planes, TokenPlaneTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

TEST_P(TokenPlaneTest, EitherTokenAWorkerProvedKeysItsDataSession) {
  std::string run_dir = (std::filesystem::temp_directory_path() / "ps-token-plane-XXXXXX").string();
  ASSERT_NE(::mkdtemp(run_dir.data()), nullptr);
  server::ServerOptions o;
  o.num_workers = 2;
  o.aggregate_only = true;
  o.aggregator = "mean";
  o.round_deadline = milliseconds(10000);
  o.run_dir = run_dir;
  o.tokens_file = Path("tokens");
  o.udp_port = 0;
  o.data_plane = GetParam();
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  const std::string tokens[] = {Token("worker-0"), testing::WorkerToken(c, 1)};
  ASSERT_NE(tokens[1], "");
  ASSERT_NE(tokens[1], Token("worker-1")) << "worker 1 holds the derived token";
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 6, 0}}, 128, 1);
  for (const PushPath path : {PushPath::kDataPlane, PushPath::kUdp}) {
    const uint64_t round = path == PushPath::kUdp ? 1 : 0;
    SCOPED_TRACE(path == PushPath::kUdp ? "over UDP" : "on the plane");
    std::vector<std::unique_ptr<Worker>> workers;
    for (uint32_t w = 0; w < 2; ++w) {
      WorkerOptions wo;
      wo.shard_addresses = c.addresses();
      wo.worker_id = w;
      wo.credentials.token = tokens[w];
      wo.connect_timeout = milliseconds(20000);
      wo.push.path = path;
      auto worker = Worker::Start(wo, layout);
      ASSERT_TRUE(worker.ok()) << "worker " << w << ": " << worker.status();
      EXPECT_EQ((*worker)->shards()[0].data_plane, GetParam());
      workers.push_back(*std::move(worker));
    }
    for (uint32_t w = 0; w < 2; ++w) {
      ASSERT_TRUE(workers[w]->Push(0, round, std::vector<float>(6, 1.0f + 2.0f * w)).ok());
      ASSERT_TRUE(workers[w]->WaitPushes().ok()) << "worker " << w;
    }
    for (uint32_t w = 0; w < 2; ++w) {
      std::vector<float> out(6);
      absl::StatusOr<uint64_t> pulled = workers[w]->Pull(0, round + 1, out, milliseconds(20000));
      ASSERT_TRUE(pulled.ok()) << "worker " << w << ": " << pulled.status();
      EXPECT_EQ(out, std::vector<float>(6, 2.0f)) << "worker " << w;
    }
  }
  EXPECT_EQ(Refused(c.shard(0), server::Refusal::kUnauthenticated), 0u);
  c = testing::Cluster();
  std::filesystem::remove_all(run_dir);
}

// Runs ps-admin with `args`; returns its exit status and stdout.
std::pair<int, std::string> Admin(const std::string& args) {
  const std::string cmd = std::string(PS_ADMIN_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int rc = ::pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// Kubelet gRPC probes speak plaintext: --health-port serves the TLS shard's health
// statuses without TLS, and nothing else.
TEST(HealthPortTest, PlaintextProbesSeeTheTlsShardsStatusAndNothingElse) {
  server::ServerOptions o = MutualTlsShard();
  o.health_port = 0;
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  const uint16_t port = c.shard(0).health_port();
  ASSERT_NE(port, 0);
  ASSERT_NE(port, c.shard(0).port());
  const std::string health_addr = "127.0.0.1:" + std::to_string(port);
  auto channel = grpc::CreateChannel(health_addr, grpc::InsecureChannelCredentials());

  auto check = [&](const std::string& service) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = grpc::health::v1::Health::NewStub(channel)->Check(Context().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << service << ": " << s.error_message();
    return resp.status();
  };
  using Status = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(check(""), Status::SERVING);
  EXPECT_EQ(check("ps.v1.WorkerService"), Status::SERVING);
  EXPECT_EQ(check("ps.v1.Model"), Status::NOT_SERVING);  // no layout registered yet

  // Workers' and admin calls are not served there.
  auto plain = v1::WorkerService::NewStub(channel);
  v1::JoinRequest req;
  v1::JoinResponse resp;
  EXPECT_EQ(plain->Join(Context().get(), req, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);

  // ps-admin: health over plaintext, status only with the admin certificate over mTLS.
  auto [rc, out] = Admin("--address " + health_addr + " health --service ps.v1.WorkerService");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"status\":\"SERVING\""));
  std::tie(rc, out) = Admin("--address " + health_addr + " health --service ps.v1.Model");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out, HasSubstr("NOT_SERVING"));
  std::tie(rc, out) = Admin("--address " + health_addr + " status");
  EXPECT_EQ(rc, 1) << out;
  const std::string tls = " --tls-ca " + Path("ca.pem") + " --tls-cert " + Path("admin.pem") +
                          " --tls-key " + Path("admin.key");
  std::tie(rc, out) = Admin("--address " + c.addresses()[0] + tls + " status");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"serving\":true"));
  const std::string worker_tls = " --tls-ca " + Path("ca.pem") + " --tls-cert " + Path("worker-0.pem") +
                                 " --tls-key " + Path("worker-0.key");
  std::tie(rc, out) = Admin("--address " + c.addresses()[0] + worker_tls + " status");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out, HasSubstr("admin"));

  // Draining turns the plaintext port's statuses too.
  c.shard(0).Shutdown();
  std::tie(rc, out) = Admin("--address " + health_addr + " health --timeout-s 2");
  EXPECT_NE(rc, 0) << out;
}

}  // namespace
}  // namespace ps
