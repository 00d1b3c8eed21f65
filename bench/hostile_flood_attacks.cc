// The attacks of `ps-bench hostile` that flood the shard with large or many requests,
// datagrams or connections (hostile_attacks.h; docs/bench.md, "Hostile clients").
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/hostile_attacks.h"
#include "net/udp_frame.h"
#include "ps/v1/ps.grpc.pb.h"

namespace ps::bench {

using std::chrono::milliseconds;

namespace {


// Connections of one identity that a flood with worker 3's token opens: the shard keeps
// 4 per identity (--max-connections-per-client) and closes the least recently used one
// for a fifth, so a flood on more would close worker 3's own connections, the cover's
// among them, and the rounds would wait for worker 3 as if it pushed nothing (the cost
// lands on the attacker's identity, and the tests of the connection table show it). The
// flood stays within the bound, beside the cover's connection, to measure what its
// requests cost.
constexpr uint32_t kIdentityFloodConnections = 3;

// Keeps `limits->inflight` copies of one request, given as raw bytes, in flight on up to
// 8 connections (kIdentityFloodConnections with a token) until told to stop (a cheap
// client: the bytes are serialized once and shared by every call), with `token` (empty:
// none). Counts the answers.
void FloodRaw(AttackEnv& env, const std::string& method, const std::string& bytes,
              const std::string& token) {
  const uint32_t inflight = std::max<uint32_t>(env.limits->inflight, 1);
  const uint32_t connections =
      std::min<uint32_t>(inflight, token.empty() ? 8 : kIdentityFloodConnections);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (uint32_t i = 0; i < connections; ++i) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(OwnChannel(env.attacker->address())));
  }
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  struct Call {
    grpc::ClientContext ctx;
    grpc::ByteBuffer response;
    bool done = false;  // guarded by mu
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Call>> calls;  // guarded by mu; reaped by this thread
  uint32_t open = 0;                         // guarded by mu
  for (uint64_t i = 0;; ++i) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, milliseconds(50), [&] { return open < inflight; });
    std::erase_if(calls, [](const std::unique_ptr<Call>& c) { return c->done; });
    if (!env.more()) break;
    if (open >= inflight) continue;
    calls.push_back(std::make_unique<Call>());
    Call* call = calls.back().get();
    ++open;
    lock.unlock();
    Prepare(call->ctx, token, milliseconds(10000));
    stubs[i % stubs.size()]->UnaryCall(&call->ctx, method, grpc::StubOptions(), &request,
                                       &call->response, [&, call](grpc::Status s) {
                                         env.tally->Count(s);
                                         std::lock_guard done_lock(mu);
                                         call->done = true;
                                         --open;
                                         cv.notify_all();
                                       });
  }
  std::unique_lock lock(mu);
  for (const std::unique_ptr<Call>& c : calls) {
    if (!c->done) c->ctx.TryCancel();
  }
  cv.wait(lock, [&] { return open == 0; });
}

}  // namespace

// RegisterLayout of 2^16 tensors (the most a layout may have) with 100-byte names, a 7 MB
// message, after the layout exists (the shard answers from the hash of the tensor list).
void LayoutTensors(AttackEnv& env, int) {
  v1::RegisterLayoutRequest req;
  req.set_session(env.attacker->session());
  for (uint32_t i = 0; i < core::kMaxTensors; ++i) {
    v1::TensorSpec* t = req.mutable_layout()->add_tensors();
    std::string name = absl::StrCat("t", i, "-");
    name.resize(100, 'n');
    t->set_name(std::move(name));
    t->set_numel(1);
  }
  req.mutable_layout()->set_slice_elems(1);
  req.mutable_layout()->set_num_shards(1);
  FloodRaw(env, "/ps.v1.WorkerService/RegisterLayout", req.SerializeAsString(),
           env.attacker->token());
}

namespace {

// The same bytes per request as layout_tensors, but in one `bytes` field, which costs the
// shard one copy to parse: pushes of 7 MiB payloads for round 0 (long closed: refused as
// late), to tell the cost of the bytes from that of the tensors. `token`: whose.
void BigPushes(AttackEnv& env, const std::string& token) {
  v1::PushRequest req;
  req.set_session(env.attacker->session());
  req.set_layout_hash(env.attacker->layout_hash());
  req.set_round(0);
  req.set_slice_id(0);
  req.set_codec("fp32");
  req.set_payload(std::string(7 << 20, '\x01'));
  FloodRaw(env, "/ps.v1.WorkerService/Push", req.SerializeAsString(), token);
}

}  // namespace

void BigMessages(AttackEnv& env, int) { BigPushes(env, env.attacker->token()); }

// The same without any token: refused as unauthenticated, once the whole message arrived.
void AnonMessages(AttackEnv& env, int) { BigPushes(env, ""); }

// Issue 45, finding 5: as each round opens, one valid datagram per slice (chunk 0 of 512
// values of 1e4) under worker 3's UDP session, and nothing more of its push. Before, that
// started the round's deadline with a quorum of 0: rounds closed on the attacker's
// chunk and the honest pushes were late. Runs without the cover (its gRPC pushes would
// complete worker 3's push), so its baseline also waits for the deadline each round.
void UdpQuorum(AttackEnv& env, int) {
  absl::StatusOr<net::DatagramKey> key = net::DatagramKey::FromBytes(env.attacker->udp_key());
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (!key.ok() || fd < 0 || env.attacker->udp_port() == 0 || env.training == nullptr) {
    env.tally->Note("udp_quorum: no UDP session (does the server run --udp-port?)");
    if (fd >= 0) ::close(fd);
    return;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(env.attacker->udp_port());
  constexpr uint32_t kChunk = 512;
  std::string payload(1 + 4 * size_t{kChunk}, '\0');
  payload[0] = '\x01';  // fp32's format version, then 1e4 in every value
  const float big = 1e4f;
  for (uint32_t i = 0; i < kChunk; ++i) std::memcpy(payload.data() + 1 + 4 * i, &big, 4);
  std::string datagram;
  for (uint64_t next = env.open_round(); env.more();) {
    if (!env.training->WaitOpen(next, milliseconds(100))) continue;
    const uint64_t round = std::max(next, env.open_round());
    for (const core::SliceInfo& s : env.layout->slices()) {
      net::DatagramHeader h;
      h.session_id = env.attacker->udp_session();
      h.worker_id = kAttackerId;
      h.slice_id = s.id;
      h.round = round;
      h.chunk_elems = kChunk;
      h.chunk_count = static_cast<uint16_t>(net::ChunkCount(s.numel, kChunk));
      if (!net::EncodeDatagram(h, "fp32", payload, *key, &datagram).ok()) continue;
      ::sendto(fd, datagram.data(), datagram.size(), 0, reinterpret_cast<const sockaddr*>(&to),
               sizeof(to));
      env.tally->CountOther();
    }
    next = round + 1;
  }
  ::close(fd);
}

// Issue 45, finding 6: pulls naming 7.6 million slice ids (7.6 MB), 8 in flight. Before,
// each cost the shard 0.28 s of CPU before it was refused; the id past the shard's slice
// count is now refused where it is read.
void PullSlices(AttackEnv& env, int) {
  v1::PullRequest req;
  req.set_session(env.attacker->session());
  req.set_layout_hash(env.attacker->layout_hash());
  const uint32_t slices = static_cast<uint32_t>(env.layout->slices().size());
  req.mutable_slice_ids()->Reserve(7'600'000);
  for (uint32_t i = 0; i < 7'600'000; ++i) req.add_slice_ids(i % slices);
  Limits eight = *env.limits;
  eight.inflight = 8;
  AttackEnv with_eight = env;
  with_eight.limits = &eight;
  FloodRaw(with_eight, "/ps.v1.WorkerService/Pull", req.SerializeAsString(), env.attacker->token());
}

// Thread 0: channels with connections of their own, each making one call (without a
// token) and then held open. Thread 1: TCP connections that never send a byte.
void ConnFlood(AttackEnv& env, int thread) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<int> sockets;
  if (thread == 0) {
    for (uint32_t i = 0; i < env.limits->grpc_connections && env.more(); ++i) {
      channels.push_back(OwnChannel(env.attacker->address()));
      std::unique_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channels.back());
      grpc::ClientContext ctx;
      Prepare(ctx, "");
      v1::JoinRequest req;
      req.set_worker_id(kAttackerId);
      req.set_layout_hash(env.attacker->layout_hash());
      v1::JoinResponse resp;
      env.tally->Count(stub->Join(&ctx, req, &resp));
    }
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(env.attacker->port());
    for (uint32_t i = 0; i < env.limits->raw_connections && env.more(); ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        env.tally->Note(absl::StrCat("connect: ", std::strerror(errno)));
        ::close(fd);
        break;
      }
      sockets.push_back(fd);
      env.tally->CountOther();
    }
  }
  while (!env.stop->load()) std::this_thread::sleep_for(milliseconds(20));
  for (int fd : sockets) ::close(fd);
}

}  // namespace ps::bench
