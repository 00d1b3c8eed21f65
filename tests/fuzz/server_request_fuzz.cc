// Fuzz target for what a shard does with request bytes from the network: a Layout
// (protobuf), a PushRequest (net/wire.h, in place), an AdoptRequest or an
// AdoptSliceRequest parsed from the input, then handed
// to the Shard the way the gRPC service does (layout validation, slice lookup, codec choice, decode, round
// bookkeeping, aggregation, publication).
//
// Input: byte 0 selects the request kind (bit 2 clear: bit 0 picks a layout (0) or a
// push (1); bit 2 set: bit 0 picks an adoption vote (0) or an adopted slice value (1))
// and whether the harness sets the registered layout hash (bit 1), so the fuzzer gets
// past the hash check; byte 1 picks the worker id (modulo 3); the rest is the protobuf
// message.
// The shard must never crash, and every published value must stay finite.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "aggregators/aggregator.h"
#include "core/clock.h"
#include "core/fp32_bytes.h"
#include "core/layout.h"
#include "core/thread_pool.h"
#include "google/protobuf/stubs/logging.h"
#include "net/layout_proto.h"
#include "net/wire.h"
#include "ps/v1/ps.pb.h"
#include "server/shard.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr uint32_t kWorkers = 3;

struct Harness {
  Harness() : pool(1) {
    // Invalid UTF-8 in string fields is refused as it should be, but protobuf also logs
    // each one: millions of lines that slow the fuzzer and bury its report.
    google::protobuf::SetLogHandler(nullptr);
    ps::server::ServerOptions o;
    o.num_workers = kWorkers;
    o.num_byzantine = 1;
    o.aggregator = "median";
    o.learning_rate = 0.1f;
    ps::aggregators::AggregatorOptions a;
    a.num_workers = kWorkers;
    a.num_byzantine = 1;
    auto rule = ps::aggregators::MakeAggregator("median", a);
    PS_FUZZ_CHECK(rule.ok(), "median refused");
    shard = std::make_unique<ps::server::Shard>(o, 0, std::move(rule).value(), &clock, &pool);
    auto l = ps::core::ModelLayout::Create({{"w", 40, 0}, {"b", 3, 1}}, 16, 1);
    PS_FUZZ_CHECK(l.ok(), "layout refused");
    layout = std::make_unique<ps::core::ModelLayout>(*l);
    PS_FUZZ_CHECK(shard->RegisterLayout(0, *layout).ok(), "registration failed");
    for (const ps::core::SliceInfo& s : layout->slices()) {
      std::string bytes;
      ps::core::AppendFp32(std::vector<float>(s.numel, 0.5f), &bytes);
      PS_FUZZ_CHECK(shard->InitSlice(0, layout->hash(), s.id, bytes).ok(), "init failed");
    }
  }

  ps::core::ManualClock clock;
  ps::core::ThreadPool pool;
  std::unique_ptr<ps::server::Shard> shard;
  std::unique_ptr<ps::core::ModelLayout> layout;
};

void CheckPublishedFinite(Harness& h) {
  for (const ps::core::SliceInfo& s : h.layout->slices()) {
    ps::server::SliceSnapshot snap = h.shard->Snapshot(s.id);
    PS_FUZZ_CHECK(snap.values->size() == size_t{s.numel} * 4, "published slice has the wrong size");
    std::vector<float> v(s.numel);
    std::memcpy(v.data(), snap.values->data(), snap.values->size());
    PS_FUZZ_CHECK(ps::core::FindNonFinite(v) < 0, "published a non-finite value");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();  // one shard across inputs: rounds accumulate
  if (size < 2) return 0;
  const bool push = data[0] & 1;
  const bool fix_hash = data[0] & 2;
  const uint32_t worker = data[1] % kWorkers;
  const void* body = data + 2;
  const int body_size = static_cast<int>(size - 2);

  if (data[0] & 4) {
    // Mid-run adoption: votes of any worker for any round and root, and slice values,
    // which only pass once two of the three workers voted alike (the quorum).
    if (!push) {
      ps::v1::AdoptRequest msg;
      if (!msg.ParseFromArray(body, body_size)) return 0;
      const uint64_t hash = fix_hash ? h->layout->hash() : msg.layout_hash();
      (void)h->shard->Adopt(worker, hash, msg.round(), msg.root());
    } else {
      ps::v1::AdoptSliceRequest msg;
      if (!msg.ParseFromArray(body, body_size)) return 0;
      const uint64_t hash = fix_hash ? h->layout->hash() : msg.layout_hash();
      (void)h->shard->AdoptSlice(worker, hash, msg.round(), msg.slice_id(), msg.values());
    }
    CheckPublishedFinite(*h);
    return 0;
  }

  if (!push) {
    ps::v1::Layout msg;
    if (!msg.ParseFromArray(body, body_size)) return 0;
    std::vector<ps::core::TensorSpec> tensors;
    // Layouts of up to kMaxSlices slices are valid, but one of millions of slices takes
    // a minute to build under ASan (a 26-byte input found it): skip those between
    // kMaxFuzzSlices and the limit, whose refusal (cheap, before building) stays fuzzed.
    constexpr uint64_t kMaxFuzzSlices = uint64_t{1} << 16;
    uint64_t slices = 0;
    for (const auto& t : msg.tensors()) {
      tensors.push_back({t.name(), t.numel(), t.priority()});
      const uint64_t e = msg.slice_elems();
      if (e > 0) slices += t.numel() / e + (t.numel() % e != 0 ? 1 : 0);
      slices = std::min<uint64_t>(slices, uint64_t{1} << 40);
    }
    // The request path: a shard with a layout answers from the request's hash, whatever
    // its size (it must never build it).
    auto answered = h->shard->RegisterLayout(worker, tensors, msg.slice_elems(), msg.num_shards());
    // What a refused join (and the service's answer to RegisterLayout) says of the
    // request: bounded whatever the names' lengths.
    const std::string difference = ps::net::LayoutDifference(*h->layout, msg);
    PS_FUZZ_CHECK(difference.size() < 1024, "the layout difference grew with the request");
    PS_FUZZ_CHECK(!answered.ok(), "a second layout was accepted from a request");
    if (slices > kMaxFuzzSlices && slices <= ps::core::kMaxSlices) return 0;
    auto layout = ps::core::ModelLayout::Create(std::move(tensors), msg.slice_elems(), msg.num_shards());
    if (layout.ok()) {
      uint64_t covered = 0;
      for (const auto& s : layout->slices()) {
        PS_FUZZ_CHECK(s.numel > 0 && s.numel <= layout->slice_elems(), "slice size out of range");
        PS_FUZZ_CHECK(s.shard < layout->num_shards(), "slice on a shard that does not exist");
        covered += s.numel;
      }
      PS_FUZZ_CHECK(covered == layout->total_elems(), "slices do not cover the tensors");
      // The shard already holds a layout: anything else must be refused cleanly.
      auto r = h->shard->RegisterLayout(worker, *layout);
      PS_FUZZ_CHECK(!r.ok(), "a second layout was accepted");
    }
    return 0;
  }

  // As the service reads a push: in place, from the pieces gRPC received (here the
  // body cut in two), with the payload gathered only when it spans pieces.
  const std::string_view all(static_cast<const char*>(body), static_cast<size_t>(body_size));
  const std::string_view pieces[] = {all.substr(0, all.size() / 2), all.substr(all.size() / 2)};
  absl::StatusOr<ps::net::PushFrame> msg = ps::net::ParsePushRequest(pieces);
  if (!msg.ok()) return 0;
  const uint64_t hash = fix_hash ? h->layout->hash() : msg->layout_hash;
  std::string codec, payload;
  (void)h->shard->Push(worker, hash, msg->round, msg->slice_id, msg->codec.Contiguous(&codec),
                       msg->payload.Contiguous(&payload));
  h->shard->Tick(h->clock.Now());
  CheckPublishedFinite(*h);
  return 0;
}
