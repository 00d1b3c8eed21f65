// Fuzz target for the shard's end of a TCP data connection (server/transport/tcp/
// connection.cc, docs/data-plane.md section 3): the input is what a worker sends on one
// connection, written over a real loopback socket into a real tcp::Backend serving a
// real Shard through its ShardFront. The data_frame target covers the frame codecs; this
// one covers the connection's state machine around them: the handshake, pushes and their
// answers, pulls and their slices, CANCEL, GOAWAY, the bounds, and what closing frees.
//
// Byte 0: the harness's choices; the rest: the stream.
//   bit 0  the harness makes the handshake first (HELLO under the worker's data session,
//          the shard's CHALLENGE checked, the right PROOF, ADMIT), so the stream starts
//          after ADMIT (PUSH, PULL, CANCEL, GOAWAY); else the stream is the connection's
//          first bytes
//   bit 1  the connection is worker 1's (else worker 0's)
//   bit 2  before the stream the other worker's round-0 pushes of both slices go to the
//          front, so that the stream's own round-0 push of a slice closes its round and
//          publishes version 1 (a pull waiting for it then gets its slices)
//   bit 3  without the handshake: a first frame that is a HELLO with a 52-byte meta gets
//          the worker's real data session id (random per join) and worker id written
//          over its own, so that the stream reaches the CHALLENGE and its PROOF (which it
//          cannot compute) is what the shard judges
//   bit 4  with the handshake: the worker joins again after ADMIT, replacing the
//          connection's session (its next PUSH or PULL is refused unknown_session)
// Per input a fresh shard as tests/server/tcp_backend_test.cc's fixture makes it (2
// workers; tensor "w" of 8 values in slices 0 and 1 of 4, layout hash 0x2263362fc05040a2,
// which make_corpus.py's DATA_CONNECTION seeds name; mean, aggregate-only, so version 0 is ready at
// once; at most 2 pulls per worker; TCP plane; no tarpit, so every refusal is answered
// at once; largest body 64 KiB), its front and a backend on an ephemeral loopback port.
// The harness writes the stream (reading what the shard answers meanwhile), half-closes
// and reads until the shard closes.
//
// Aborts (PS_FUZZ_CHECK) when: the harness's own handshake fails or the shard's
// CHALLENGE does not prove the session's key; the shard has not closed the connection
// 10 s after the stream's end, or Backend::stats().open is not back at 0 10 s after the
// harness closed its socket (the connection freed); a pull's watches are left
// (Shard::WatcherCount() > 0) or a worker cannot open its max_pulls_per_worker pulls
// (a place not given back); without the handshake the shard admits the connection, sends
// anything but CHALLENGE and GOAWAY, or accepts a push (no forged proof may pass); the
// shard's stream, read as the worker's channel reads it (ParseHeader, CheckHeader in the
// worker's state with ADMIT's limits, each meta's parser), holds a frame the worker
// refuses, anything after a GOAWAY, or, when it ended cleanly, half a frame. ASan and
// UBSan (the libFuzzer build) catch the rest, on the backend's threads too.
// Seeds: tests/fuzz/corpus/data_connection/ (DATA_CONNECTION in make_corpus.py).
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/thread_pool.h"
#include "crypto/auth_proof.h"
#include "net/data_frame.h"
#include "server/shard.h"
#include "server/shard_front.h"
#include "server/transport/tcp/backend.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_socket.h"

namespace {

using ps::fuzz::DataFrame;
using ps::fuzz::ReadDataFrame;
using ps::fuzz::Socket;
using ps::fuzz::SteadyClock;
using ps::net::ConnectionState;
using ps::net::FrameType;
namespace server = ps::server;
namespace tcp = server::transport::tcp;

constexpr uint32_t kWorkers = 2;
constexpr uint32_t kMaxPullsPerWorker = 2;
constexpr uint32_t kMaxBody = 1 << 16;
constexpr auto kBound = std::chrono::seconds(10);
// ModelLayout::Create({{"w", 8, 0}}, 4, 1).hash(), named by the seeds' pushes and pulls.
constexpr uint64_t kLayoutHash = 0x2263362fc05040a2;

constexpr uint8_t kHandshake = 1 << 0;
constexpr uint8_t kWorkerOne = 1 << 1;
constexpr uint8_t kOtherPushes = 1 << 2;
constexpr uint8_t kPatchHello = 1 << 3;
constexpr uint8_t kRejoin = 1 << 4;

// Process-wide: the shards' aggregation pool (each shard waits for its jobs when it
// goes), and quiet logs.
struct Process {
  Process() : pool(1) { spdlog::set_level(spdlog::level::off); }
  ps::core::ThreadPool pool;
};

// One input's shard, front and backend, torn down in the server's order (the backend
// before the front, the front before the shard).
struct Stage {
  explicit Stage(ps::core::ThreadPool* pool) {
    server::ServerOptions o;
    o.num_workers = kWorkers;
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.round_deadline = std::chrono::seconds(30);
    o.max_pulls_per_worker = kMaxPullsPerWorker;
    o.data_plane = ps::core::DataPlane::kTcp;
    ps::aggregators::AggregatorOptions a;
    a.num_workers = kWorkers;
    auto rule = ps::aggregators::MakeAggregator("mean", a);
    PS_FUZZ_CHECK(rule.ok(), "mean refused");
    shard = std::make_unique<server::Shard>(o, 0, *std::move(rule), ps::core::Clock::Real(), pool);
    auto layout = ps::core::ModelLayout::Create({{"w", 8, 0}}, 4, 1);
    PS_FUZZ_CHECK(layout.ok(), "layout refused");
    hash = layout->hash();
    PS_FUZZ_CHECK(hash == kLayoutHash,
                  "the layout's hash changed: update kLayoutHash and the seeds");
    for (uint32_t w = 0; w < kWorkers; ++w) {
      auto joined = shard->Join(w, hash);
      PS_FUZZ_CHECK(joined.ok(), "join refused");
      joins.push_back(*joined);
    }
    PS_FUZZ_CHECK(shard->RegisterLayout(0, *layout).ok(), "registration failed");
    front = std::make_unique<server::ShardFront>(shard.get(), nullptr, nullptr);
    tcp::Options t;
    t.max_body_bytes = kMaxBody;
    t.limits.proof_timeout = kBound;
    auto started = tcp::Backend::Start(t, front.get(), ps::core::Clock::Real());
    if (!started.ok()) std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
    PS_FUZZ_CHECK(started.ok(), "the backend did not start");
    backend = *std::move(started);
  }
  ~Stage() {
    backend->Stop();
    backend.reset();
    front.reset();
    shard.reset();
  }

  std::unique_ptr<server::Shard> shard;
  std::unique_ptr<server::ShardFront> front;
  std::unique_ptr<tcp::Backend> backend;
  std::vector<server::JoinResult> joins;
  uint64_t hash = 0;
};

std::string Fp32(float v) {
  std::string payload;
  const std::vector<float> values(4, v);
  PS_FUZZ_CHECK((*ps::codecs::MakeCodec("fp32"))->Encode(values, &payload).ok(), "fp32 encode");
  return payload;
}

server::DataPeer PeerOf(uint32_t worker) {
  return server::DataPeer{.worker = worker, .client = "worker-" + std::to_string(worker)};
}

// The handshake of an honest worker; the ADMIT's limits.
ps::net::AdmitMeta Handshake(Socket& sock, const server::JoinResult& join, uint32_t worker) {
  ps::net::HelloMeta hello{.data_session = join.data_session, .worker_id = worker};
  for (size_t i = 0; i < hello.client_nonce.size(); ++i) {
    hello.client_nonce[i] = static_cast<char>(i);
  }
  std::string out, in;
  PS_FUZZ_CHECK(ps::net::AppendHello(hello, &out).ok(), "HELLO");
  PS_FUZZ_CHECK(sock.Send(out, SteadyClock::now() + kBound, &in), "sending the HELLO failed");
  DataFrame f;
  PS_FUZZ_CHECK(ReadDataFrame(sock, &in, &f, SteadyClock::now() + kBound) &&
                    f.header.type == FrameType::kChallenge,
                "no CHALLENGE after the harness's HELLO");
  auto c = ps::net::ParseChallengeMeta(f.meta);
  PS_FUZZ_CHECK(c.ok() && c->shard_index == 0, "a CHALLENGE the worker refuses");
  const std::string client_nonce(hello.client_nonce.begin(), hello.client_nonce.end());
  const std::string server_nonce(c->server_nonce.begin(), c->server_nonce.end());
  // Joined without a token, the key is the session's secret (--insecure).
  PS_FUZZ_CHECK(std::string_view(c->proof.data(), c->proof.size()) ==
                    ps::crypto::DataServerProof(join.data_secret, "shard-0", join.data_session,
                                              client_nonce, server_nonce),
                "the shard's CHALLENGE does not prove the session's key");
  const std::string proof = ps::crypto::DataClientProof(
      join.data_secret, "shard-0", join.data_session, client_nonce, server_nonce);
  ps::net::ProofMeta p;
  std::memcpy(p.proof.data(), proof.data(), p.proof.size());
  out.clear();
  PS_FUZZ_CHECK(ps::net::AppendProof(p, &out).ok(), "PROOF");
  PS_FUZZ_CHECK(sock.Send(out, SteadyClock::now() + kBound, &in), "sending the PROOF failed");
  PS_FUZZ_CHECK(ReadDataFrame(sock, &in, &f, SteadyClock::now() + kBound) &&
                    f.header.type == FrameType::kAdmit,
                "no ADMIT after the right PROOF");
  PS_FUZZ_CHECK(in.empty(), "bytes after ADMIT before any request");
  auto admit = ps::net::ParseAdmitMeta(f.meta);
  PS_FUZZ_CHECK(admit.ok() && admit->max_body_bytes == kMaxBody && admit->max_pull_slices == 2,
                "an ADMIT with other limits");
  return *admit;
}

// The shard's stream as the worker's channel reads it, from `state` with `limits`.
// `clean`: it ended with the end of the stream (not a reset), so it ends with a frame.
void CheckShardStream(std::string_view in, ConnectionState state, ps::net::FrameLimits limits,
                      bool admitted, bool clean) {
  while (!in.empty()) {
    if (in.size() < ps::net::kFrameHeaderBytes) break;
    auto h = ps::net::ParseHeader(
        std::span<const char, ps::net::kFrameHeaderBytes>(in.data(), ps::net::kFrameHeaderBytes));
    PS_FUZZ_CHECK(h.ok(), "the shard wrote a header the worker refuses");
    PS_FUZZ_CHECK(ps::net::CheckHeader(*h, state, limits).ok(),
                  "the shard wrote a frame its state or limits do not allow");
    const size_t size = ps::net::kFrameHeaderBytes + h->meta_bytes + h->body_bytes;
    if (in.size() < size) break;
    const std::string_view meta = in.substr(ps::net::kFrameHeaderBytes, h->meta_bytes);
    switch (h->type) {
      case FrameType::kChallenge:
        PS_FUZZ_CHECK(ps::net::ParseChallengeMeta(meta).ok(), "a CHALLENGE the worker refuses");
        state = ConnectionState::kWorkerAwaitsAdmit;
        break;
      case FrameType::kAdmit:
        PS_FUZZ_CHECK(admitted,
                      "the shard admitted a connection whose PROOF was not made by the harness");
        break;
      case FrameType::kAnswer:
      case FrameType::kPullEnd:
      case FrameType::kGoaway:
        PS_FUZZ_CHECK(ps::net::ParseStatusMeta(h->type, meta).ok(),
                      "a status frame the worker refuses");
        break;
      case FrameType::kSlice:
        PS_FUZZ_CHECK(ps::net::ParseSliceMeta(h->flags, meta).ok(), "a SLICE the worker refuses");
        break;
      case FrameType::kSlices:
        PS_FUZZ_CHECK(ps::net::ParseSlicesMeta(*h, meta).ok(), "a SLICES the worker refuses");
        break;
      default:
        PS_FUZZ_CHECK(false, "the shard wrote a worker's frame type");
    }
    in.remove_prefix(size);
    if (h->type == FrameType::kGoaway) {
      PS_FUZZ_CHECK(in.empty(), "the shard wrote after its GOAWAY");
      return;
    }
  }
  PS_FUZZ_CHECK(!clean || in.empty(), "the shard's stream ended inside a frame");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Process* process = new Process();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool handshake = (mode & kHandshake) != 0;
  const uint32_t worker = (mode & kWorkerOne) != 0 ? 1 : 0;

  Stage stage(&process->pool);
  const server::JoinResult join = stage.joins[worker];
  uint64_t accepted_before = 0;
  if ((mode & kOtherPushes) != 0) {
    const std::string payload = Fp32(3.0f);
    const std::string_view piece = payload;
    for (uint32_t slice : {0u, 1u}) {
      PS_FUZZ_CHECK(
          stage.front
              ->Push(PeerOf(1 - worker),
                     server::PushHead{
                         .layout_hash = stage.hash, .round = 0, .slice_id = slice, .codec = "fp32"},
                     std::span<const std::string_view>(&piece, 1))
              .ok(),
          "the other worker's push was refused");
    }
    accepted_before = 2;
  }

  Socket sock = Socket::Connect(stage.backend->port(), SteadyClock::now() + kBound);
  if (!sock.ok()) std::fprintf(stderr, "connect: %s\n", std::strerror(errno));
  PS_FUZZ_CHECK(sock.ok(), "cannot connect to the backend");
  ConnectionState state = ConnectionState::kWorkerAwaitsChallenge;
  ps::net::FrameLimits limits;
  if (handshake) {
    const ps::net::AdmitMeta admit = Handshake(sock, join, worker);
    state = ConnectionState::kWorkerAdmitted;
    limits.max_body_bytes = admit.max_body_bytes;
    if ((mode & kRejoin) != 0) {
      PS_FUZZ_CHECK(stage.shard->Join(worker, stage.hash).ok(), "the re-join was refused");
    }
  } else if ((mode & kPatchHello) != 0 && stream.size() >= ps::net::kFrameHeaderBytes + 52 &&
             static_cast<uint8_t>(stream[0]) == static_cast<uint8_t>(FrameType::kHello) &&
             stream[2] == 52 && stream[3] == 0) {
    // HELLO meta: magic (4), version (4), data session (8), worker id (4), nonce (32).
    for (int i = 0; i < 8; ++i) {
      stream[ps::net::kFrameHeaderBytes + 8 + i] = static_cast<char>(join.data_session >> (8 * i));
    }
    for (int i = 0; i < 4; ++i) {
      stream[ps::net::kFrameHeaderBytes + 16 + i] = static_cast<char>(worker >> (8 * i));
    }
  }

  // The stream, the end of it, and whatever the shard says until it closes.
  std::string in;
  (void)sock.Send(stream, SteadyClock::now() + kBound, &in);  // false: the shard closed first
  sock.ShutdownWrite();
  PS_FUZZ_CHECK(sock.ReadToEnd(&in, SteadyClock::now() + kBound),
                "the shard did not close the connection within 10 s of the stream's end");
  const bool clean = sock.ended_cleanly();
  sock.Close();

  const auto freed_by = SteadyClock::now() + kBound;
  while (stage.backend->stats().open != 0 && SteadyClock::now() < freed_by) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  PS_FUZZ_CHECK(stage.backend->stats().open == 0,
                "the connection was not closed and freed within 10 s of the harness's close");
  PS_FUZZ_CHECK(stage.shard->WatcherCount() == 0, "a closed connection's pull left its watches");
  for (uint32_t w = 0; w < kWorkers; ++w) {
    std::vector<std::unique_ptr<server::PullHandle>> places;
    for (uint32_t i = 0; i < kMaxPullsPerWorker; ++i) {
      auto p = stage.front->OpenPull(
          PeerOf(w),
          server::PullAsk{.layout_hash = stage.hash, .min_version = 1u << 30, .slice_ids = {0}});
      PS_FUZZ_CHECK(p.ok(), "a closed connection's pull kept its place");
      places.push_back(*std::move(p));
    }
  }
  PS_FUZZ_CHECK(stage.shard->WatcherCount() == 0, "an unstarted pull left its watches");

  const server::transport::tcp::Stats stats = stage.backend->stats();
  PS_FUZZ_CHECK(stats.accepted == 1 && stats.refused == 0,
                "the backend refused the one connection");
  PS_FUZZ_CHECK(stats.admitted == (handshake ? 1u : 0u), "admitted without the harness's proof");
  if (!handshake) {
    PS_FUZZ_CHECK(stage.shard->stats().pushes_accepted == accepted_before,
                  "a push was accepted on a connection that was never admitted");
  }
  CheckShardStream(in, state, limits, handshake, clean);
  return 0;
}
