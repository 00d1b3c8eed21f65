// Fuzz target for the worker's decoder of compressed pulls: HeldModel::Apply
// (worker_lib/held_model_internal.h), which takes what a shard with --pull-codec sends
// for a slice (dense values stamped with an epoch, or the encoded change from the
// version the worker holds) and writes the slice's values to the caller's buffer.
//
// Input: a sequence of frames for one HeldModel over a layout of two slices (64 and 37
// values). Each frame is 6 bytes and a payload:
//   byte 0: bit 0 the slice, bit 1 a change (else dense values), bits 2-3 the epoch
//           (0..3), bits 4-7 the codec: an index into kCodecs, or 15: the spec follows
//           as one length byte (at most 48) and that many bytes
//   byte 1: version; byte 2: base version
//   bytes 3-4: payload length (little-endian; cut to what is left)
//   byte 5: where the payload is cut into two pieces (modulo its length + 1)
// Apply must not crash and must refuse with INVALID_ARGUMENT and a message. When it
// accepts, the caller's buffer is finite for a change it applied, and Describe reports the frame's
// version for the frame's epoch when one is held. When it refuses, what Describe reports
// stays as it was or, for a change decoded and refused, becomes nothing held.
// Seeds: tests/fuzz/corpus/held_model/ (tests/fuzz/make_corpus.py).
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/layout.h"
#include "net/wire.h"
#include "tests/fuzz/fuzz_check.h"
#include "worker_lib/held_model_internal.h"

namespace {

constexpr std::array<const char*, 15> kCodecs = {"fp32",
                                                 "fp16",
                                                 "bf16",
                                                 "3lc",
                                                 "3lc(s=1.9)",
                                                 "sign",
                                                 "topk(0.1)+fp16",
                                                 "int8",
                                                 "qsgd(s=4)",
                                                 "terngrad",
                                                 "topk(0.25)",
                                                 "threshold(0.5)",
                                                 "powersgd(rank=1)",
                                                 "unknown",
                                                 "fp16+fp32"};

const ps::core::ModelLayout& Layout() {
  static const ps::core::ModelLayout layout = [] {
    auto made = ps::core::ModelLayout::Create({{"a", 64, 0}, {"b", 37, 1}}, 64, 1);
    PS_FUZZ_CHECK(made.ok(), "the fixed layout was refused");
    return *std::move(made);
  }();
  return layout;
}

// (epoch, version of the slice) as Describe reports them; (0, 0) when nothing is held.
std::pair<uint64_t, uint64_t> Held(const ps::internal::HeldModel& held, uint32_t slice) {
  ps::internal::PullAsk ask;
  ask.slice_ids.push_back(slice);
  held.Describe(ask);
  if (ask.held_epoch == 0) return {0, 0};
  PS_FUZZ_CHECK(ask.held_versions.size() == 1, "Describe gave a version per slice id");
  return {ask.held_epoch, ask.held_versions[0]};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  ps::internal::HeldModel held(Layout());
  std::vector<float> dst(64);
  for (int frames = 0; in.size() >= 6 && frames < 64; ++frames) {
    const uint8_t b0 = static_cast<uint8_t>(in[0]);
    ps::net::PullFrame frame;
    frame.slice_id = b0 & 1;
    const bool change = (b0 & 2) != 0;
    frame.epoch = (b0 >> 2) & 3;
    frame.version = static_cast<uint8_t>(in[1]);
    frame.base_version = static_cast<uint8_t>(in[2]);
    size_t len = static_cast<uint8_t>(in[3]) | (size_t{static_cast<uint8_t>(in[4])} << 8);
    const uint8_t cut = static_cast<uint8_t>(in[5]);
    in.remove_prefix(6);
    std::string spec;
    if (change) {
      const size_t codec = b0 >> 4;
      if (codec < kCodecs.size()) {
        spec = kCodecs[codec];
      } else if (!in.empty()) {
        const size_t n = std::min<size_t>({static_cast<uint8_t>(in[0]), 48, in.size() - 1});
        spec = std::string(in.substr(1, n));
        in.remove_prefix(1 + n);
      }
      if (spec.empty()) spec = "fp32";
    }
    len = std::min(len, in.size());
    const std::string_view payload = in.substr(0, len);
    in.remove_prefix(len);
    const size_t at = payload.empty() ? 0 : cut % (payload.size() + 1);
    if (at > 0) frame.values.Append(payload.substr(0, at));
    if (at < payload.size()) frame.values.Append(payload.substr(at));
    if (!spec.empty()) frame.codec.Append(spec);

    const auto before = Held(held, frame.slice_id);
    const absl::Status st = held.Apply(frame, dst.data());
    const auto after = Held(held, frame.slice_id);
    if (!st.ok()) {
      PS_FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument,
                    "Apply refused with a code other than INVALID_ARGUMENT");
      PS_FUZZ_CHECK(!st.message().empty(), "Apply refused without a message");
      // A change that was decoded and refused drops the slice (the next pull asks for
      // its values whole); no refusal makes it hold another version.
      PS_FUZZ_CHECK(before == after || after == std::make_pair(uint64_t{0}, uint64_t{0}),
                    "a refused frame changed what is held to another version");
      continue;
    }
    const size_t numel = Layout().slices()[frame.slice_id].numel;
    // A change of the version already held is not applied again: the held values come
    // back as they are (finite or not, as the dense values were).
    const bool applied = before != std::make_pair(frame.epoch, frame.version);
    if (change && applied) {
      for (size_t i = 0; i < numel; ++i) {
        PS_FUZZ_CHECK(std::isfinite(dst[i]), "an applied change left a non-finite value");
      }
      PS_FUZZ_CHECK(after.first == frame.epoch && after.second == frame.version,
                    "an applied change is not what is held");
    } else if (!change && frame.epoch != 0) {
      PS_FUZZ_CHECK(after.first == frame.epoch && after.second == frame.version,
                    "dense values with an epoch are not what is held");
    }
  }
  return 0;
}
