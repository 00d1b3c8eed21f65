// Fuzz target for checkpoint files (server/checkpoint.h): DecodeCheckpoint on the bytes
// read from --checkpoint-dir, then, for a file that decodes, what a starting shard does
// with it (Shard::Restore into a fresh shard with the checkpoint's shard id and count,
// then Capture and a round trip through EncodeCheckpoint).
//
// Input: byte 0 bit 0 makes the harness frame the rest as a checkpoint body (magic,
// length and a correct SHA-256 around it), so the fuzzer reaches the protobuf parser and
// the content checks behind the checksum; otherwise the rest is the whole file, which
// exercises the header, length and checksum checks. A decoded checkpoint must be
// restorable by the shard it names (or refused with a status), must hold only finite
// values, and must survive Encode -> Decode unchanged in its versions and values.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "aggregators/aggregator.h"
#include "core/clock.h"
#include "core/thread_pool.h"
#include "server/checkpoint.h"
#include "server/options.h"
#include "server/shard.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckFinite(const ps::server::ShardCheckpoint& c) {
  for (const ps::server::SliceCheckpoint& s : c.slices) {
    PS_FUZZ_CHECK(s.values.size() % sizeof(float) == 0, "values not whole floats");
    for (size_t i = 0; i < s.values.size(); i += sizeof(float)) {
      float f;
      std::memcpy(&f, s.values.data() + i, sizeof(f));
      PS_FUZZ_CHECK(std::isfinite(f), "decoded a non-finite value");
    }
    for (float f : s.velocity) PS_FUZZ_CHECK(std::isfinite(f), "decoded a non-finite velocity");
    for (float f : s.rule_state) PS_FUZZ_CHECK(std::isfinite(f), "decoded non-finite rule state");
  }
}

void Restore(const ps::server::ShardCheckpoint& c) {
  ps::server::ServerOptions o;
  o.num_workers = 3;
  o.num_shards = c.num_shards;
  o.shard_id = static_cast<int>(c.shard_id);
  o.aggregator = "median";
  if (o.num_shards > 64) return;  // Validate allows more; the harness stays small
  if (o.num_shards > 1) {
    o.peers.clear();
    for (uint32_t i = 0; i < o.num_shards; ++i) o.peers.push_back("127.0.0.1:1");
  }
  if (!o.Validate().ok()) return;  // e.g. more shards than the options allow
  ps::aggregators::AggregatorOptions a;
  a.num_workers = o.num_workers;
  auto rule = ps::aggregators::MakeAggregator(o.aggregator, a);
  PS_FUZZ_CHECK(rule.ok(), "median refused");
  ps::core::ManualClock clock;
  ps::core::ThreadPool pool(1);
  ps::server::Shard shard(o, c.shard_id, std::move(rule).value(), &clock, &pool);
  if (!shard.Restore(c).ok() || !c.layout.has_value()) return;
  absl::StatusOr<ps::server::ShardCheckpoint> captured = shard.Capture();
  PS_FUZZ_CHECK(captured.ok(), "a restored shard cannot capture a checkpoint");
  PS_FUZZ_CHECK(captured->MaxVersion() == c.MaxVersion(), "restore changed the newest version");
  PS_FUZZ_CHECK(captured->layout.has_value() && captured->layout->hash() == c.layout->hash(),
                "restore changed the layout");
  for (const ps::server::SliceCheckpoint& s : c.slices) {
    const ps::server::SliceSnapshot snap = shard.Snapshot(s.slice_id);
    PS_FUZZ_CHECK(snap.values != nullptr && *snap.values == s.values,
                  "restore changed a slice's values");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string file = (data[0] & 1) != 0 ? ps::server::FrameCheckpoint(rest) : std::string(rest);
  absl::StatusOr<ps::server::ShardCheckpoint> c = ps::server::DecodeCheckpoint(file);
  if (!c.ok()) {
    PS_FUZZ_CHECK(c.status().code() == absl::StatusCode::kDataLoss ||
                      c.status().code() == absl::StatusCode::kInvalidArgument,
                  "a bad checkpoint got neither DATA_LOSS nor INVALID_ARGUMENT");
    PS_FUZZ_CHECK(!c.status().message().empty(), "a refusal without a message");
    return 0;
  }
  CheckFinite(*c);
  absl::StatusOr<ps::server::ShardCheckpoint> again =
      ps::server::DecodeCheckpoint(ps::server::EncodeCheckpoint(*c));
  PS_FUZZ_CHECK(again.ok(), "a decoded checkpoint does not decode after encoding");
  PS_FUZZ_CHECK(again->slices.size() == c->slices.size(), "round trip lost slices");
  for (size_t i = 0; i < c->slices.size(); ++i) {
    PS_FUZZ_CHECK(again->slices[i].version == c->slices[i].version &&
                      again->slices[i].values == c->slices[i].values &&
                      again->slices[i].velocity == c->slices[i].velocity &&
                      again->slices[i].rule_state == c->slices[i].rule_state,
                  "round trip changed a slice");
  }
  Restore(*c);
  return 0;
}
