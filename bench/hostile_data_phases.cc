#include "bench/hostile_data_phases.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "core/status.h"
#include "net/data_frame.h"
#include "tests/support/data_port_client.h"

namespace ps::bench {
namespace {

using std::chrono::milliseconds;
using testing::DataFrame;
using testing::DataPortClient;

// An attacker waits this long for an answer: a shard's tarpit may hold refusals longer,
// and the phase would otherwise end late.
constexpr milliseconds kReadTimeout{1000};
// Held connections are closed and opened again after this long.
constexpr milliseconds kHold{1000};

// A connection to the data port from `source`; null (and a note) when the connect fails.
std::unique_ptr<DataPortClient> Connect(const DataPortControl& c, const char* source) {
  auto client = std::make_unique<DataPortClient>(
      c.target().port, DataPortClient::Options{.source = source, .receive_timeout = kReadTimeout});
  if (client->connected()) return client;
  c.note(absl::StrCat("a connect from ", source, " failed"));
  std::this_thread::sleep_for(milliseconds(10));  // the backlog may be full: do not spin
  return nullptr;
}

void Sleep(const DataPortControl& c, milliseconds total) {
  for (milliseconds slept{0}; slept < total && !c.stopped(); slept += milliseconds(20)) {
    std::this_thread::sleep_for(milliseconds(20));
  }
}

// Until the phase ends: max_connections connections from `source`, each sending `first`
// (if any) and then nothing, held for kHold, closed, and opened again. The shard closes
// those over its per-source bound at once, the rest at its proof timeout.
void Hold(const DataPortControl& c, const char* source, const std::string& first) {
  while (!c.stopped()) {
    std::vector<std::unique_ptr<DataPortClient>> held;
    for (uint32_t i = 0; i < c.max_connections && c.more(); ++i) {
      std::unique_ptr<DataPortClient> client = Connect(c, source);
      if (client == nullptr) break;
      if (!first.empty()) client->Send(first);
      held.push_back(std::move(client));
      c.unanswered(1);
    }
    Sleep(c, kHold);
  }
}

// What the shard answered `client` for `what`: a GOAWAY is a refusal; another frame means
// `what` was not refused; silence or a close without a GOAWAY is unanswered.
void ReadAnswer(const DataPortControl& c, DataPortClient& client, std::string_view what) {
  absl::StatusOr<DataFrame> f = client.Read();
  if (!f.ok()) {
    c.unanswered(1);
    return;
  }
  if (f->header.type == net::FrameType::kGoaway) {
    c.refused(DataPortClient::StatusOf(*f));
    return;
  }
  c.accepted(absl::StrCat(core::AsAbsl(what), " was answered with ",
                          core::AsAbsl(net::FrameTypeName(f->header.type))));
}

void UnknownHellos(const DataPortControl& c, int thread) {
  std::mt19937_64 rng(static_cast<uint64_t>(thread) + 1);
  while (c.more()) {
    std::unique_ptr<DataPortClient> client = Connect(c, "127.0.0.4");
    if (client == nullptr) continue;
    const DataPortTarget t = c.target();
    uint64_t session = rng();
    if (session == t.data_session) ++session;
    client->Send(testing::HelloFrame(session, t.worker));
    ReadAnswer(c, *client, "a HELLO under an unknown session");
  }
}

// The 16 bytes of a PUSH header claiming the largest body its 32-bit length can name
// (4 GiB - 1: the wire has no room for a claim of 2^40 bytes), with nothing after them.
std::string LargestClaim() {
  std::string header;
  (void)net::EncodeHeader(
      net::FrameHeader{
          .type = net::FrameType::kPush, .meta_bytes = 25, .body_bytes = 0xFFFFFFFF, .tag = 1},
      &header);
  return header;
}

// Thread 0 sends the claim as a connection's first bytes; thread 1 after a handshake as
// worker 3 (whose token and session the attacker holds), where a PUSH is allowed and
// only the size is wrong.
void LargestClaims(const DataPortControl& c, int thread) {
  const std::string claim = LargestClaim();
  while (c.more()) {
    // Each variant from its own source: the shard penalizes a source for the first.
    std::unique_ptr<DataPortClient> client = Connect(c, thread == 0 ? "127.0.0.5" : "127.0.0.8");
    if (client == nullptr) continue;
    if (thread == 1) {
      const DataPortTarget t = c.target();
      absl::StatusOr<net::AdmitMeta> admitted = client->Handshake(
          t.data_session, t.worker,
          testing::DataConnectionKey(t.token, 0, t.data_session, t.data_secret));
      if (!admitted.ok()) {
        c.unanswered(1);  // refused or closed: the source's earlier claims may have cost it
        c.note(absl::StrCat("worker 3's own handshake failed: ", admitted.status().message()));
        Sleep(c, milliseconds(20));
        continue;
      }
    }
    client->Send(claim);
    ReadAnswer(c, *client, "a header claiming 4 GiB");
  }
}

// HELLOs under worker 3's real session, then PROOFs keyed by forged tokens.
void ForgedProofs(const DataPortControl& c, int thread) {
  for (uint64_t n = 0; c.more(); ++n) {
    std::unique_ptr<DataPortClient> client = Connect(c, "127.0.0.6");
    if (client == nullptr) continue;
    const DataPortTarget t = c.target();
    const std::string forged = absl::StrCat("forged-token-", thread, "-", n);
    absl::StatusOr<net::AdmitMeta> admitted = client->Handshake(
        t.data_session, t.worker,
        testing::DataConnectionKey(forged, 0, t.data_session, t.data_secret));
    if (admitted.ok()) {
      c.accepted("a PROOF keyed by a forged token was admitted");
    } else if (absl::StartsWith(admitted.status().message(), "GOAWAY")) {
      c.refused(admitted.status());
    } else {
      c.unanswered(1);  // held by the tarpit past kReadTimeout, or closed
    }
  }
}

}  // namespace

DataPortCover::DataPortCover(std::function<DataPortTarget()> target,
                             const core::ModelLayout& layout, Rounds rounds)
    : target_(std::move(target)), layout_(layout), rounds_(std::move(rounds)) {
  const std::unique_ptr<codecs::Codec> fp32 = *codecs::MakeCodec("fp32");
  for (const core::SliceInfo& s : layout_.slices()) {
    std::string payload;
    (void)fp32->Encode(std::vector<float>(s.numel, 2e-4f), &payload);  // fp32 cannot fail
    payloads_.push_back(std::move(payload));
  }
  thread_ = std::thread([this] { Loop(); });
}

DataPortCover::~DataPortCover() {
  stop_.store(true);
  thread_.join();
}

void DataPortCover::Loop() {
  std::unique_ptr<DataPortClient> conn;
  uint64_t next = 0, tag = 0;
  while (!stop_.load()) {
    if (!rounds_.wait_open(next, milliseconds(100))) continue;
    const uint64_t round = std::max(next, rounds_.open_version());
    if (conn == nullptr) {
      const DataPortTarget t = target_();
      conn = std::make_unique<DataPortClient>(t.port);
      absl::StatusOr<net::AdmitMeta> admitted = conn->Handshake(
          t.data_session, t.worker,
          testing::DataConnectionKey(t.token, 0, t.data_session, t.data_secret));
      if (!admitted.ok()) {
        counts_.Refused(absl::StrCat("handshake: ", admitted.status().message()));
        conn.reset();
        std::this_thread::sleep_for(milliseconds(20));
        continue;
      }
    }
    std::string out;
    for (const core::SliceInfo& s : layout_.slices()) {
      (void)net::AppendPush(
          ++tag,
          net::PushMeta{
              .layout_hash = layout_.hash(), .round = round, .slice_id = s.id, .codec = "fp32"},
          payloads_[s.id].size(), &out);
      out += payloads_[s.id];
    }
    bool answered = conn->Send(out);
    for (size_t i = 0; answered && i < layout_.slices().size(); ++i) {
      absl::StatusOr<DataFrame> f = conn->Read();
      answered = f.ok() && f->header.type == net::FrameType::kAnswer;
      if (!answered) break;
      const absl::Status st = DataPortClient::StatusOf(*f);
      if (st.ok() || absl::IsAlreadyExists(st)) {
        counts_.Pushed();
      } else {
        counts_.Refused(std::string(st.message()));
      }
    }
    if (!answered) {  // lost or sent away: the round again on a new connection
      conn.reset();
      continue;
    }
    next = round + 1;
  }
}

std::vector<DataPortAttack> DataPortAttacks() {
  return {
      {"data_silent_flood",
       "TCP data port: connections from 127.0.0.2 that never send a byte (2 x 256, above "
       "the per-source bound), held and opened again",
       2, [](const DataPortControl& c, int) { Hold(c, "127.0.0.2", ""); }},
      {"data_stalled_header",
       "TCP data port: 8 of a frame header's 16 bytes from 127.0.0.3, then nothing, held", 1,
       [](const DataPortControl& c, int) { Hold(c, "127.0.0.3", std::string(8, '\x01')); }},
      {"data_unknown_hello",
       "TCP data port: HELLO under random sessions that do not exist from 127.0.0.4", 2,
       UnknownHellos},
      {"data_huge_header",
       "TCP data port: a PUSH header claiming 4 GiB - 1 (the largest 32-bit claim), before any "
       "HELLO from 127.0.0.5 and after worker 3's own handshake from 127.0.0.8",
       2, LargestClaims},
      {"data_forged_proof",
       "TCP data port: HELLO under worker 3's session from 127.0.0.6, then a PROOF keyed by a "
       "forged token",
       2, ForgedProofs},
  };
}

}  // namespace ps::bench
