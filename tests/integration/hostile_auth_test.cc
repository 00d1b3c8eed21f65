// The hostile suite's authentication cases (issue 45, finding 4; docs/operations.md,
// "Threat model and limits"): another local user takes the port of a shard that is down,
// and the trainer, ps-admin and a peer shard try it; the run directory given with a
// trailing slash or as a symbolic link; forged and stale proofs. Real shards on loopback
// (in this process, or the ps-server binary), a real ps::Worker, the ps-admin binary.
//
// gRPC-only, whatever the data plane: every case is about the control port's credentials
// (a channel's challenge and proofs, the run directory), which a worker must pass before
// any Join answer names a data port. The TCP data port's own handshake (forged and
// replayed proofs, sessions that do not exist, a replaced session) is attacked in
// tests/server/tcp_backend_test.cc and hostile_data_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "auth_util.h"
#include "cluster_util.h"
#include "core/refusal.h"
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "net/channel_auth.h"
#include "process_util.h"
#include "ps/v1/ps.grpc.pb.h"
#include "server/server.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using std::chrono::milliseconds;
using Kind = core::Identity::Kind;

constexpr char kNotProven[] = "could not prove it holds this run's secret";

std::string TempDir(const std::string& name) {
  std::string dir = (std::filesystem::temp_directory_path() / (name + "-XXXXXX")).string();
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

std::chrono::system_clock::time_point In(milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// Another local user's process on a shard's port: a gRPC server that answers every call
// and records its method and metadata. It answers a challenge with a made-up proof (it
// has no secret to make a right one) and every other call with OK.
class Squatter final : public grpc::CallbackGenericService {
 public:
  struct Call {
    std::string method;
    std::multimap<std::string, std::string> metadata;
  };

  explicit Squatter(uint16_t port) {
    grpc::ServerBuilder builder;
    int bound = 0;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &bound);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
    EXPECT_NE(bound, 0) << "the squatter could not bind port " << port;
  }
  ~Squatter() override { server_->Shutdown(In(milliseconds(1000))); }

  std::vector<Call> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  // Whether a challenge naming `key` came.
  bool Challenged(const std::string& key) const {
    for (const Call& c : calls()) {
      for (const auto& [name, value] : c.metadata) {
        if (name == "authorization" &&
            value.starts_with(absl::StrCat("PS-Challenge-v1 ", key, " "))) {
          return true;
        }
      }
    }
    return false;
  }

 private:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    Call call{ctx->method(), {}};
    for (const auto& [name, value] : ctx->client_metadata()) {
      call.metadata.emplace(std::string(name.data(), name.size()),
                            std::string(value.data(), value.size()));
    }
    {
      std::lock_guard lock(mu_);
      calls_.push_back(call);
    }
    class Answer final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Answer(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    if (call.method == std::string(crypto::kChallengeMethod)) {
      const std::string made_up(crypto::kProofBytes, '\x33');
      return new Answer(grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          crypto::ChallengeAnswer(core::Identity{Kind::kShard, 0}, *crypto::NewNonce(), made_up)));
    }
    return new Answer(grpc::Status::OK);
  }

  mutable std::mutex mu_;
  std::vector<Call> calls_;
  std::unique_ptr<grpc::Server> server_;
};

// Runs ps-admin with `args`: its exit status and stderr.
std::pair<int, std::string> Admin(std::vector<std::string> args) {
  args.insert(args.begin(), PS_ADMIN_BINARY);
  testing::Process admin(args);
  const int rc = admin.Wait(milliseconds(30000));
  return {rc, admin.Log()};
}

server::ServerOptions ShardOptions(const std::string& run_dir, const std::vector<uint16_t>& ports,
                                   uint32_t id) {
  server::ServerOptions o;
  o.data_plane = core::DataPlane::kGrpc;  // the clients here are ps.v1 stubs
  o.host = "127.0.0.1";
  o.port = ports[id];
  o.shard_id = static_cast<int>(id);
  o.num_shards = static_cast<uint32_t>(ports.size());
  for (uint16_t p : ports) o.peers.push_back(absl::StrCat("127.0.0.1:", p));
  o.num_workers = 1;
  o.aggregator = "mean";
  o.aggregate_only = true;
  o.threads = 2;
  o.drain_timeout = milliseconds(200);
  o.run_dir = run_dir;
  return o;
}

std::unique_ptr<server::Server> StartShard(const server::ServerOptions& o) {
  absl::StatusOr<std::unique_ptr<server::Server>> s = server::Server::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

uint64_t Unauthenticated(server::Server& s) {
  return s.shard().stats().refusals[static_cast<size_t>(server::Refusal::kUnauthenticated)];
}

// Finding 4: while shard 0 is down, another local user binds its port. The trainer,
// ps-admin and peer shard 1 used to hand it the worker-0, admin and shard-1 tokens
// (bearer tokens go to whoever listens), which the real shard took after its restart.
// Now each of them asks the listener to prove it holds the run's secret first, refuses
// to go on when it cannot, and sends nothing the real shard would take.
TEST(HostileAuthTest, ASquattedPortGetsNothingTheShardTakes) {
  const std::string run_dir = TempDir("ps-hostile-auth-run");
  const std::vector<uint16_t> ports = testing::PickFreePorts(2);
  ASSERT_EQ(ports.size(), 2u);
  const std::string address0 = absl::StrCat("127.0.0.1:", ports[0]);
  const server::ServerOptions options0 = ShardOptions(run_dir, ports, 0);
  // Shard 0's first start makes the run directory's secret and token files; then it is
  // down, and the squatter takes its port.
  StartShard(options0).reset();
  const std::string secret = *crypto::ReadSecretFile(run_dir + "/secret");
  const core::Identity worker0{Kind::kWorker, 0}, admin{Kind::kAdmin, 0}, shard1{Kind::kShard, 1};
  const std::string worker_token = *crypto::ReadRunDirectoryToken(run_dir, worker0);
  const std::string admin_token = *crypto::ReadRunDirectoryToken(run_dir, admin);
  auto squatter = std::make_unique<Squatter>(ports[0]);
  std::unique_ptr<server::Server> peer = StartShard(ShardOptions(run_dir, ports, 1));
  ASSERT_NE(peer, nullptr);

  // The trainer: its start fails at shard 0, naming the address.
  WorkerOptions wo;
  wo.shard_addresses = {address0, absl::StrCat("127.0.0.1:", ports[1])};
  wo.worker_id = 0;
  wo.credentials.token = worker_token;
  wo.connect_timeout = milliseconds(10000);
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 8, 0}}, 4, 2);
  absl::StatusOr<std::unique_ptr<Worker>> trainer = Worker::Start(wo, layout);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kUnauthenticated) << trainer.status();
  EXPECT_THAT(std::string(trainer.status().message()),
              HasSubstr(absl::StrCat("the process listening on ", address0, " ", kNotProven)));
  // ps-admin with the run directory's admin token.
  auto [rc, out] = Admin({"--address", address0, "--run-dir", run_dir, "--timeout-s", "10",
                          "status"});
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out, HasSubstr(kNotProven));
  // Peer shard 1's Hello (every 250 ms at first).
  for (int i = 0; i < 200 && !squatter->Challenged("shard-1"); ++i) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(squatter->Challenged("shard-1"));
  for (int i = 0; i < 100 && peer->serving(); ++i) std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(peer->serving()) << "a peer that cannot prove itself is a problem";

  // What the squatter got: challenges only, no token, no proof.
  const std::vector<Squatter::Call> recorded = squatter->calls();
  EXPECT_TRUE(squatter->Challenged("worker-0"));
  EXPECT_TRUE(squatter->Challenged("admin"));
  const std::vector<std::string> secrets = {
      worker_token, admin_token, crypto::DeriveToken(secret, shard1),
      // The MAC halves of the derived tokens, and the secret itself.
      worker_token.substr(worker_token.find('.') + 1),
      admin_token.substr(admin_token.find('.') + 1), absl::BytesToHexString(secret)};
  for (const Squatter::Call& c : recorded) {
    EXPECT_EQ(c.method, crypto::kChallengeMethod) << "a call went past a failed challenge";
    for (const auto& [name, value] : c.metadata) {
      for (const std::string& s : secrets) {
        EXPECT_EQ(value.find(s), std::string::npos) << name << ": " << value;
      }
      if (name == "authorization") {
        EXPECT_THAT(value, StartsWith("PS-Challenge-v1 "));
      }
    }
  }

  // The shard is back on its port: whatever the squatter recorded, replayed as the
  // credentials of a worker's, the admin's or a peer's call, is refused.
  squatter.reset();
  std::unique_ptr<server::Server> shard0 = StartShard(options0);
  ASSERT_NE(shard0, nullptr);
  const uint64_t refused_before = Unauthenticated(*shard0);
  auto channel = grpc::CreateChannel(address0, grpc::InsecureChannelCredentials());
  auto workers = v1::WorkerService::NewStub(channel);
  auto admins = v1::AdminService::NewStub(channel);
  auto peers = v1::PeerService::NewStub(channel);
  // Each client's first challenge (shard 1 sent one per Hello; one of each is enough,
  // and stays within the tarpit's budget), by the token it names.
  std::map<std::string, std::string> first_by_key;
  for (const Squatter::Call& c : recorded) {
    for (const auto& [name, value] : c.metadata) {
      if (name == "authorization") first_by_key.emplace(value.substr(0, value.rfind(' ')), value);
    }
  }
  EXPECT_EQ(first_by_key.size(), 3u);
  int replayed = 0;
  for (const auto& entry : first_by_key) {
    const auto replay = [&](auto&& call) {
      grpc::ClientContext ctx;
      ctx.set_deadline(In(milliseconds(10000)));
      ctx.AddMetadata("authorization", entry.second);
      const grpc::Status s = call(&ctx);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << entry.second << ": " << s.error_message();
      ++replayed;
    };
    v1::JoinRequest join;
    v1::JoinResponse joined;
    replay([&](grpc::ClientContext* ctx) { return workers->Join(ctx, join, &joined); });
    v1::StatusResponse status;
    replay([&](grpc::ClientContext* ctx) {
      return admins->Status(ctx, v1::StatusRequest(), &status);
    });
    v1::PeerHelloRequest hello;
    hello.set_shard_id(1);
    v1::PeerHelloResponse answer;
    replay([&](grpc::ClientContext* ctx) { return peers->Hello(ctx, hello, &answer); });
  }
  EXPECT_EQ(replayed, 9);
  EXPECT_EQ(Unauthenticated(*shard0), refused_before + static_cast<uint64_t>(replayed));

  // The honest clients work: the trainer, ps-admin, and the peer (its Hello, every 5 s by
  // now, finds shard 0 agreeing).
  trainer = Worker::Start(wo, layout);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::tie(rc, out) = Admin({"--address", address0, "--run-dir", run_dir, "status"});
  EXPECT_EQ(rc, 0) << out;
  for (int i = 0; i < 300 && !peer->serving(); ++i) std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(peer->serving());
  (*trainer).reset();
  peer.reset();
  shard0.reset();
  std::filesystem::remove_all(run_dir);
}

// Finding 4, related: `--run-dir DIR/` followed a symbolic link at DIR (lstat of "DIR/"
// resolves it), so a link another user planted made the shard keep its secret and the
// workers' tokens in that user's directory. The binary refuses such a directory, and
// writes nothing through the link.
TEST(HostileAuthTest, ARunDirectoryGivenAsASymbolicLinkIsRefused) {
  const std::string dir = TempDir("ps-hostile-auth-link");
  const std::string theirs = dir + "/theirs";
  ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
  const std::string link = dir + "/run";
  ASSERT_EQ(symlink(theirs.c_str(), link.c_str()), 0);
  for (const std::string& given : {link + "/", link}) {
    testing::Process server({PS_SERVER_BINARY, "--port", "0", "--run-dir", given});
    EXPECT_NE(server.Wait(milliseconds(15000)), 0) << given;
    EXPECT_THAT(server.Log(), HasSubstr("is a symbolic link")) << given;
  }
  EXPECT_TRUE(std::filesystem::is_empty(theirs));
  std::filesystem::remove_all(dir);
}

// What a client without the token can make of a challenge it does not check: a proof
// with its own guess of the token, for the shard's current process.
std::string ForgedProof(const std::string& address, const std::string& guessed_token) {
  const std::string key = crypto::TokenKey(guessed_token);
  const grpc::Status s = net::SendChallenge(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), key, *crypto::NewNonce(),
      In(milliseconds(10000)), /*wait_for_ready=*/false);
  std::optional<crypto::ChallengeReply> reply = crypto::ParseChallengeAnswer(s.error_message());
  EXPECT_TRUE(reply.has_value()) << s.error_message();
  if (!reply.has_value()) return "";
  return crypto::ProofHeader(
      key, reply->server_nonce,
      crypto::CallProof(guessed_token, key, reply->server.Name(), reply->server_nonce));
}

// The shard's side over gRPC: a proof made without the secret, a stale one (the shard
// restarted), a bearer token on the plaintext port: refused from the metadata, while an
// answered challenge is no refusal and costs the shard only its metadata.
TEST(HostileAuthTest, ForgedStaleAndBearerCredentialsAreRefusedChallengesAreNot) {
  const std::string run_dir = TempDir("ps-hostile-auth-stale");
  const std::vector<uint16_t> ports = testing::PickFreePorts(1);
  ASSERT_EQ(ports.size(), 1u);
  const server::ServerOptions options = ShardOptions(run_dir, ports, 0);
  std::unique_ptr<server::Server> shard = StartShard(options);
  ASSERT_NE(shard, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", ports[0]);
  const std::string token =
      *crypto::ReadRunDirectoryToken(run_dir, core::Identity{Kind::kWorker, 0});
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const auto join = [&](const std::string& authorization) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(milliseconds(10000)));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    v1::JoinRequest req;
    req.set_layout_hash(1);
    v1::JoinResponse resp;
    return stub->Join(&ctx, req, &resp);
  };

  // Challenges (with a 4 MiB body, which is never read) are answered, not refused.
  const uint64_t refused = Unauthenticated(*shard);
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(milliseconds(10000)));
    ctx.AddMetadata("authorization", crypto::ChallengeHeader("worker-0", *crypto::NewNonce()));
    grpc::GenericStub generic(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::Slice body(std::string(4 << 20, 'b'));
    grpc::ByteBuffer request(&body, 1), response;
    std::mutex mu;
    std::condition_variable cv;
    std::optional<grpc::Status> status;
    generic.UnaryCall(&ctx, std::string(crypto::kChallengeMethod), grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) {
                        std::lock_guard lock(mu);
                        status = std::move(s);
                        cv.notify_one();
                      });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return status.has_value(); });
    EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status->error_message(), StartsWith("ps-auth-challenge-v1 shard-0 "));
  }
  EXPECT_EQ(Unauthenticated(*shard), refused);

  // A proof made with a token of another secret, in the right form.
  const std::string forged =
      crypto::DeriveToken(std::string(crypto::kSecretBytes, '\x5a'), core::Identity{Kind::kWorker, 0});
  grpc::Status s = join(ForgedProof(address, forged));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("wrong proof"));
  // The worker's real token as a bearer token: refused on this plaintext port.
  s = join("Bearer " + token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("bearer tokens are refused on a plaintext port"));

  // A proof of the real token, good until the shard restarts; stale afterwards.
  const std::string proof = ForgedProof(address, token);
  EXPECT_TRUE(join(proof).ok());
  net::ChannelAuth& honest = testing::Auth(address, token);
  const auto honest_join = [&] {
    v1::JoinRequest req;
    req.set_layout_hash(1);
    v1::JoinResponse resp;
    return honest.Unary(In(milliseconds(10000)), /*wait_for_ready=*/true,
                        [&](grpc::ClientContext* ctx) { return stub->Join(ctx, req, &resp); });
  };
  EXPECT_TRUE(honest_join().ok());
  EXPECT_EQ(honest.challenges(), 1u);
  shard.reset();
  shard = StartShard(options);
  ASSERT_NE(shard, nullptr);
  s = join(proof);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), StartsWith("ps-auth-stale-v1 "));
  // The client object runs the challenge again by itself and the call goes through.
  EXPECT_TRUE(honest_join().ok());
  EXPECT_EQ(honest.challenges(), 2u);
  EXPECT_EQ(honest.proven_shard(), (core::Identity{Kind::kShard, 0}));
  shard.reset();
  std::filesystem::remove_all(run_dir);
}

}  // namespace
}  // namespace ps
