// The attacks of `ps-bench hostile` made of gRPC requests that are wrong, or in another's
// name (hostile_attacks.h; docs/bench.md, "Hostile clients").
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/hostile_attacks.h"
#include "core/credentials.h"
#include "crypto/cluster_secret.h"
#include "ps/v1/ps.grpc.pb.h"

namespace ps::bench {

using std::chrono::milliseconds;

namespace {

v1::RegisterLayoutRequest LayoutRequest(uint64_t numel, uint32_t slice_elems) {
  v1::RegisterLayoutRequest req;
  v1::TensorSpec* t = req.mutable_layout()->add_tensors();
  t->set_name("hostile");
  t->set_numel(numel);
  req.mutable_layout()->set_slice_elems(slice_elems);
  req.mutable_layout()->set_num_shards(1);
  return req;
}

// RegisterLayout in a loop, cycling through `requests`. Before the honest layout exists
// the shard checks each; afterwards it answers from the layout hash.
void RegisterLayouts(AttackEnv& env, std::vector<v1::RegisterLayoutRequest> requests,
                     std::vector<std::string> names) {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  for (size_t i = 0; env.more(); ++i) {
    v1::RegisterLayoutRequest& req = requests[i % requests.size()];
    req.set_session(env.attacker->session());
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    v1::RegisterLayoutResponse resp;
    const grpc::Status s = stub->RegisterLayout(&ctx, req, &resp);
    env.tally->Count(s);
    if (s.ok())
      env.tally->Accepted(
          absl::StrCat("RegisterLayout of ", names[i % names.size()], " was accepted"));
  }
}

// Opens `n` Pull streams of `req` at once, none of which is ever read, and waits for
// their status (each ends at `deadline` at the latest; all are cancelled when told to
// stop). Returns the statuses.
std::vector<grpc::Status> OpenUnreadPulls(AttackEnv& env, v1::WorkerService::Stub& stub,
                                          const v1::PullRequest& req, uint32_t n,
                                          milliseconds deadline) {
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncReader<v1::PullResponse>> reader;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (uint32_t i = 0; i < n; ++i) {
    auto c = std::make_unique<Call>();
    Prepare(c->ctx, env.attacker->token(), deadline);
    c->reader = stub.PrepareAsyncPull(&c->ctx, req, &cq);
    c->reader->StartCall(reinterpret_cast<void*>(uintptr_t{2} * i));
    c->reader->Finish(&c->status, reinterpret_cast<void*>(uintptr_t{2} * i + 1));
    calls.push_back(std::move(c));
  }
  size_t events = 2 * size_t{n};
  bool cancelled = false;
  while (events > 0) {
    void* tag = nullptr;
    bool ok = false;
    const auto r = cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + milliseconds(50));
    if (r == grpc::CompletionQueue::SHUTDOWN) break;
    if (r == grpc::CompletionQueue::TIMEOUT) {
      if (env.stop->load() && !cancelled) {
        for (auto& c : calls) c->ctx.TryCancel();
        cancelled = true;
      }
      continue;
    }
    --events;
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Status> out;
  for (auto& c : calls) out.push_back(c->status);
  return out;
}

v1::PullRequest AllSlices(const AttackEnv& env, uint64_t min_version) {
  v1::PullRequest req;
  req.set_session(env.attacker->session());
  req.set_layout_hash(env.attacker->layout_hash());
  for (const core::SliceInfo& s : env.layout->slices()) req.add_slice_ids(s.id);
  req.set_min_version(min_version);
  return req;
}

}  // namespace

void LayoutWrap(AttackEnv& env, int) {
  RegisterLayouts(env, {LayoutRequest(std::numeric_limits<uint64_t>::max(), 1u << 22)},
                  {"2^64-1 elements in slices of 2^22"});
}

void LayoutHuge(AttackEnv& env, int) {
  RegisterLayouts(env, {LayoutRequest(uint64_t{1} << 24, 1), LayoutRequest(uint64_t{1} << 20, 1)},
                  {"2^24 slices", "2^20 slices"});
}

// Pushes for the open round with a new codec spec and garbage every time (the cover adds
// one of each per slice and round, and its valid pushes use new specs too).
void CodecPoison(AttackEnv& env, int thread) {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  std::mt19937_64 rng(100 + uint64_t(thread));
  const std::vector<core::SliceInfo>& slices = env.layout->slices();
  for (size_t i = size_t(thread); env.more(); ++i) {
    const core::SliceInfo& s = slices[i % slices.size()];
    v1::PushRequest req;
    req.set_session(env.attacker->session());
    req.set_layout_hash(env.attacker->layout_hash());
    req.set_round(env.open_round());
    req.set_slice_id(s.id);
    req.set_codec(env.specs->Next());
    req.set_payload(Garbage(rng, 4 * size_t{s.numel}));
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    v1::PushResponse resp;
    env.tally->Count(stub->Push(&ctx, req, &resp));
  }
}

// Thread 0: batches of far-future pulls with a 50 ms deadline, more than
// --max-pulls-per-worker at once. Thread 1: pulls of version 0 that never read what the
// shard sends, each held until its deadline.
void PullLeak(AttackEnv& env, int thread) {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  while (env.more()) {
    const std::vector<grpc::Status> statuses =
        thread == 0 ? OpenUnreadPulls(env, *stub, AllSlices(env, uint64_t{1} << 62),
                                      env.limits->pull_batch, milliseconds(50))
                    : OpenUnreadPulls(env, *stub, AllSlices(env, 0), env.limits->idle_streams,
                                      env.limits->idle_deadline);
    for (const grpc::Status& s : statuses) env.tally->Count(s);
  }
}

// After the attack: every one of worker 3's pull slots must be free again.
AttackCheck PullSlotsFree(AttackEnv& env, pid_t) {
  std::this_thread::sleep_for(milliseconds(300));
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  const std::vector<grpc::Status> statuses = OpenUnreadPulls(
      env, *stub, AllSlices(env, uint64_t{1} << 62), kMaxPullsPerWorker, milliseconds(300));
  const auto busy =
      size_t(std::count_if(statuses.begin(), statuses.end(), [](const grpc::Status& s) {
        return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      }));
  return {
      absl::StrCat("pull slots free afterwards: ", statuses.size() - busy, "/", statuses.size()),
      busy == 0};
}

// Calls in the name of others, each of which must be refused as unauthenticated or not
// permitted; any other answer counts as accepted.
void Impersonation(AttackEnv& env, int thread) {
  const std::shared_ptr<grpc::Channel> channel = OwnChannel(env.attacker->address());
  std::unique_ptr<v1::WorkerService::Stub> worker = v1::WorkerService::NewStub(channel);
  std::unique_ptr<v1::PeerService::Stub> peer = v1::PeerService::NewStub(channel);
  std::unique_ptr<v1::AdminService::Stub> admin = v1::AdminService::NewStub(channel);
  const std::string own = env.attacker->token();
  const std::string forged = absl::StrCat("worker-0.", std::string(64, '0'));
  // Tokens of the right form for other identities, derived from a secret of our own.
  const std::string other_secret(crypto::kSecretBytes, '\x5a');
  using Kind = core::Identity::Kind;
  const std::string other_worker0 = crypto::DeriveToken(other_secret, {Kind::kWorker, 0});
  const std::string other_shard1 = crypto::DeriveToken(other_secret, {Kind::kShard, 1});
  const std::string other_admin = crypto::DeriveToken(other_secret, {Kind::kAdmin, 0});
  const auto join = [&](uint32_t id, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::JoinRequest req;
    req.set_worker_id(id);
    req.set_layout_hash(env.attacker->layout_hash());
    v1::JoinResponse resp;
    return worker->Join(&ctx, req, &resp);
  };
  const auto push = [&](const std::string& session, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::PushRequest req;
    req.set_session(session);
    req.set_layout_hash(env.attacker->layout_hash());
    req.set_round(env.open_round());
    req.set_slice_id(0);
    req.set_codec("fp32");
    req.set_payload(std::string(1 + 4 * size_t{kSliceElems}, '\0'));
    v1::PushResponse resp;
    return worker->Push(&ctx, req, &resp);
  };
  const auto pull = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    const std::unique_ptr<grpc::ClientReader<v1::PullResponse>> reader =
        worker->Pull(&ctx, AllSlices(env, 0));
    v1::PullResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  };
  const auto hello = [&](uint32_t shard, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::PeerHelloRequest req;
    req.set_shard_id(shard);
    req.set_num_shards(2);
    v1::PeerHelloResponse resp;
    return peer->Hello(&ctx, req, &resp);
  };
  const auto share = [&](uint32_t shard, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::RoundShareRequest req;
    req.set_layout_hash(env.attacker->layout_hash());
    req.set_shard_id(shard);
    req.set_round(env.open_round());
    req.add_participants(0);
    req.add_gram(1.0);
    v1::RoundShareResponse resp;
    return peer->ShareRound(&ctx, req, &resp);
  };
  const auto status = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::StatusResponse resp;
    return admin->Status(&ctx, v1::StatusRequest(), &resp);
  };
  const auto checkpoint = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::CheckpointResponse resp;
    return admin->Checkpoint(&ctx, v1::CheckpointRequest(), &resp);
  };
  const std::vector<std::pair<std::string, std::function<grpc::Status()>>> attempts = {
      {"Join as worker 0 without a token", [&] { return join(0, ""); }},
      {"Join as worker 0 with worker 3's token", [&] { return join(0, own); }},
      {"Join as worker 0 with a forged token", [&] { return join(0, forged); }},
      {"Join as worker 0 with its token under another secret",
       [&] { return join(0, other_worker0); }},
      {"Join as worker 3 without a token", [&] { return join(kAttackerId, ""); }},
      {"Push with worker 3's session and no token",
       [&] { return push(env.attacker->session(), ""); }},
      {"Push with worker 3's session and worker 0's token under another secret",
       [&] { return push(env.attacker->session(), other_worker0); }},
      {"Push with a made-up session and worker 3's token",
       [&] { return push(std::string(16, 'x'), own); }},
      {"Pull with worker 3's session and no token", [&] { return pull(""); }},
      {"Hello as shard 1 with worker 3's token", [&] { return hello(1, own); }},
      {"Hello as shard 0 with worker 3's token", [&] { return hello(0, own); }},
      {"Hello as shard 1 without a token", [&] { return hello(1, ""); }},
      {"Hello as shard 1 with its token under another secret",
       [&] { return hello(1, other_shard1); }},
      {"ShareRound as shard 1 with worker 3's token", [&] { return share(1, own); }},
      {"ShareRound as shard 0 without a token", [&] { return share(0, ""); }},
      {"ShareRound as shard 1 with its token under another secret",
       [&] { return share(1, other_shard1); }},
      {"Admin Status with worker 3's token", [&] { return status(own); }},
      {"Admin Status without a token", [&] { return status(""); }},
      {"Admin Status with the admin token under another secret",
       [&] { return status(other_admin); }},
      {"Admin Checkpoint with worker 3's token", [&] { return checkpoint(own); }},
  };
  for (size_t i = size_t(thread); env.more(); ++i) {
    const auto& [name, attempt] = attempts[i % attempts.size()];
    const grpc::Status s = attempt();
    env.tally->Count(s);
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED &&
        s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
      env.tally->Accepted(
          absl::StrCat(name, ": ", CodeName(int(s.error_code())), " ", s.error_message()));
    }
  }
}

// Joins in a loop with worker 3's token, and requests whose string fields are invalid
// UTF-8 (which the server's protobuf parser refuses, and used to log, every time).
void LogFlood(AttackEnv& env, int thread) {
  const std::shared_ptr<grpc::Channel> channel = OwnChannel(env.attacker->address());
  std::unique_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channel);
  grpc::GenericStub generic(channel);
  const std::string marker(kUtf8Marker);
  for (size_t i = size_t(thread); env.more(); ++i) {
    switch (i % 5) {
      case 0:
        env.tally->Count(env.attacker->Join(*stub));
        break;
      case 1: {
        v1::RegisterLayoutRequest req = LayoutRequest(1024, 1024);
        req.set_session(env.attacker->session());
        req.mutable_layout()->mutable_tensors(0)->set_name(marker);
        env.tally->Count(CallRaw(generic, "/ps.v1.WorkerService/RegisterLayout",
                                 WithInvalidUtf8(req), env.attacker->token()));
        break;
      }
      case 2: {
        v1::PushRequest req;
        req.set_session(env.attacker->session());
        req.set_layout_hash(env.attacker->layout_hash());
        req.set_round(env.open_round());
        req.set_codec(marker);
        req.set_payload("\x01");
        env.tally->Count(CallRaw(generic, "/ps.v1.WorkerService/Push", WithInvalidUtf8(req),
                                 env.attacker->token()));
        break;
      }
      case 3: {
        v1::PeerHelloRequest req;
        req.set_shard_id(1);
        req.set_num_shards(2);
        req.set_config_summary(marker);
        env.tally->Count(CallRaw(generic, "/ps.v1.PeerService/Hello", WithInvalidUtf8(req), ""));
        break;
      }
      default: {
        grpc::ClientContext ctx;
        Prepare(ctx, env.attacker->token());
        v1::JoinRequest req;
        req.set_worker_id(1000 + uint32_t(i));
        req.set_layout_hash(env.attacker->layout_hash());
        v1::JoinResponse resp;
        env.tally->Count(stub->Join(&ctx, req, &resp));
        break;
      }
    }
  }
}

// Requests that are wrong in every other way a client can make them wrong.
void JunkRequests(AttackEnv& env, int thread) {
  const std::shared_ptr<grpc::Channel> channel = OwnChannel(env.attacker->address());
  std::unique_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channel);
  const uint64_t hash = env.attacker->layout_hash();
  v1::PullRequest pull_ids, pull_dups;
  for (uint32_t i = 0; i < 100000; ++i) {
    pull_ids.add_slice_ids(i);
    pull_dups.add_slice_ids(0);
  }
  const std::string spec_1mb(1 << 20, 'a');
  const std::string fp32_slice(1 + 4 * size_t{kSliceElems}, '\0');
  const std::string values_9mb(9 << 20, '\0');
  const auto unary = [&](auto method, auto& req, auto resp) {
    req.set_session(env.attacker->session());
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    env.tally->Count(((*stub).*method)(&ctx, req, &resp));
  };
  const auto pull = [&](v1::PullRequest& req) {
    req.set_session(env.attacker->session());
    req.set_layout_hash(hash);
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    const std::unique_ptr<grpc::ClientReader<v1::PullResponse>> reader = stub->Pull(&ctx, req);
    v1::PullResponse r;
    while (reader->Read(&r)) {
    }
    env.tally->Count(reader->Finish());
  };
  for (size_t i = size_t(thread); env.more(); ++i) {
    switch (i % 8) {
      case 0: {  // InitSlice of an initialized slice, with 3 bytes
        v1::InitSliceRequest req;
        req.set_layout_hash(hash);
        req.set_slice_id(0);
        req.set_values("abc");
        unary(&v1::WorkerService::Stub::InitSlice, req, v1::InitSliceResponse());
        break;
      }
      case 1: {  // InitSlice of slice 2^32-1
        v1::InitSliceRequest req;
        req.set_layout_hash(hash);
        req.set_slice_id(std::numeric_limits<uint32_t>::max());
        req.set_values(fp32_slice);
        unary(&v1::WorkerService::Stub::InitSlice, req, v1::InitSliceResponse());
        break;
      }
      case 2:  // Pull naming 100,000 slice ids
        pull(pull_ids);
        break;
      case 3:  // Pull naming slice 0 100,000 times
        pull(pull_dups);
        break;
      case 4: {  // Push under a 1 MiB codec spec
        v1::PushRequest req;
        req.set_layout_hash(hash);
        req.set_round(env.open_round());
        req.set_slice_id(1);
        req.set_codec(spec_1mb);
        req.set_payload(fp32_slice);
        unary(&v1::WorkerService::Stub::Push, req, v1::PushResponse());
        break;
      }
      case 5: {  // Push for round 2^64-1
        v1::PushRequest req;
        req.set_layout_hash(hash);
        req.set_round(std::numeric_limits<uint64_t>::max());
        req.set_slice_id(2);
        req.set_codec("fp32");
        req.set_payload(fp32_slice);
        unary(&v1::WorkerService::Stub::Push, req, v1::PushResponse());
        break;
      }
      case 6: {  // Join as worker 2^32-1
        grpc::ClientContext ctx;
        Prepare(ctx, env.attacker->token());
        v1::JoinRequest req;
        req.set_worker_id(std::numeric_limits<uint32_t>::max());
        req.set_layout_hash(hash);
        v1::JoinResponse resp;
        env.tally->Count(stub->Join(&ctx, req, &resp));
        break;
      }
      default: {  // InitSlice of 9 MiB, above the message limit
        v1::InitSliceRequest req;
        req.set_layout_hash(hash);
        req.set_slice_id(3);
        req.set_values(values_9mb);
        unary(&v1::WorkerService::Stub::InitSlice, req, v1::InitSliceResponse());
        break;
      }
    }
  }
}

}  // namespace ps::bench
