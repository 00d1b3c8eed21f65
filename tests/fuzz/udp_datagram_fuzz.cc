// Fuzz target for ParseDatagram, the parser of UDP gradient datagrams (net/udp_frame.h):
// the input is one datagram, exactly as it would arrive from the socket.
//
// ParseDatagram must not crash and must refuse with INVALID_ARGUMENT and a message. When
// it accepts: the views lie inside the input and cover it (header, codec, payload, MAC),
// the structural invariants hold, Verify with the target's fixed key agrees with Mac(),
// CheckChunkGeometry against a slice of kNumel coordinates either refuses cleanly or
// gives a non-empty range inside the slice, and EncodeDatagramWithNonce of the parsed fields
// re-parses to the same fields and reproduces every signed byte of the input (the format
// has one encoding per datagram), plus the MAC exactly when the input's MAC verified.
// Seeds: tests/fuzz/corpus/udp_datagram/, datagrams signed with kKey (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "net/udp_frame.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// The valid seeds are signed with this key (docs/fuzzing.md, "Seeds of udp_datagram").
constexpr std::string_view kKey = "ps-server udp_datagram fuzz key!";
// The slice the seeds' chunk geometry describes: 4 chunks of 256, the last one of 232.
constexpr uint32_t kNumel = 1000;

const ps::net::DatagramKey& Key() {
  static const ps::net::DatagramKey key = [] {
    auto made = ps::net::DatagramKey::FromBytes(kKey);
    PS_FUZZ_CHECK(made.ok(), "DatagramKey::FromBytes refused the fixed key");
    return *made;
  }();
  return key;
}

bool Inside(std::string_view part, std::string_view whole) {
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ps::net::DatagramKey& key = Key();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto parsed = ps::net::ParseDatagram(input);
  if (!parsed.ok()) {
    PS_FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument,
                  "ParseDatagram failed with a code other than INVALID_ARGUMENT");
    PS_FUZZ_CHECK(!parsed.status().message().empty(), "ParseDatagram refused without a message");
    return 0;
  }
  const ps::net::DatagramView& view = *parsed;
  const ps::net::DatagramHeader& h = view.header;

  PS_FUZZ_CHECK(size <= ps::net::kMaxDatagramBytes, "accepted an oversized datagram");
  PS_FUZZ_CHECK(!view.codec.empty() && view.codec.size() <= ps::net::kMaxDatagramCodecBytes,
                "accepted a codec of a bad length");
  PS_FUZZ_CHECK(h.chunk_elems >= 1 && h.chunk_count >= 1 && h.chunk_index < h.chunk_count,
                "accepted bad chunk fields");
  PS_FUZZ_CHECK(h.kind == ps::net::DatagramKind::kChunk ||
                    (h.kind == ps::net::DatagramKind::kEnd &&
                     view.payload.size() % ps::net::kEndEntryBytes == 0 && h.chunk_index == 0),
                "accepted an unknown kind, or an end with a partial entry or a chunk index");
  if (h.kind == ps::net::DatagramKind::kEnd) {
    // Every push an end names has the header's fields but its own slice and chunk count,
    // which is at least 1; re-appending the entries gives back the payload.
    const std::vector<ps::net::DatagramHeader> pushes =
        ps::net::EndedPushes(h, view.payload);
    PS_FUZZ_CHECK(pushes.size() == 1 + view.payload.size() / ps::net::kEndEntryBytes &&
                      pushes.size() <= ps::net::MaxEndedPushes(view.codec.size()) &&
                      pushes[0] == h,
                  "an end's pushes do not match its payload");
    std::string entries;
    for (size_t i = 1; i < pushes.size(); ++i) {
      ps::net::DatagramHeader same = pushes[i];
      same.slice_id = h.slice_id;
      same.chunk_count = h.chunk_count;
      PS_FUZZ_CHECK(same == h && pushes[i].chunk_count >= 1,
                    "an end's push differs from its header beyond slice and chunk count");
      ps::net::AppendEndEntry(pushes[i].slice_id, pushes[i].chunk_count, &entries);
    }
    PS_FUZZ_CHECK(entries == view.payload, "an end's entries do not re-encode to its payload");
  }
  PS_FUZZ_CHECK(Inside(view.codec, input) && Inside(view.payload, input) &&
                    Inside(view.signed_bytes, input) && Inside(view.mac, input),
                "a view points outside the input");
  PS_FUZZ_CHECK(view.signed_bytes.data() == input.data() &&
                    view.signed_bytes.size() + ps::net::kDatagramMacBytes == size &&
                    view.mac.data() == input.data() + view.signed_bytes.size() &&
                    view.mac.size() == ps::net::kDatagramMacBytes,
                "signed bytes and MAC do not split the input");
  PS_FUZZ_CHECK(view.codec.data() == input.data() + ps::net::kDatagramHeaderBytes &&
                    view.payload.data() == view.codec.data() + view.codec.size() &&
                    ps::net::DatagramOverhead(view.codec.size()) + view.payload.size() == size,
                "codec and payload do not tile the datagram");
  PS_FUZZ_CHECK(view.nonce.size() == ps::net::kDatagramNonceBytes &&
                    view.nonce.data() + view.nonce.size() == view.codec.data(),
                "the nonce is not the header's last field");

  const bool verified = key.Verify(view.nonce, view.signed_bytes, view.mac);
  const auto mac = key.Mac(view.nonce, view.signed_bytes);
  PS_FUZZ_CHECK(verified == (std::memcmp(mac.data(), view.mac.data(), mac.size()) == 0),
                "Verify disagrees with Mac");

  const absl::Status geometry = ps::net::CheckChunkGeometry(h, kNumel);
  if (geometry.ok()) {
    const ps::net::ChunkRange range = ps::net::ChunkRangeOf(kNumel, h.chunk_elems, h.chunk_index);
    PS_FUZZ_CHECK(
        range.count >= 1 && range.count <= h.chunk_elems && range.first + range.count <= kNumel,
        "an accepted chunk has an empty or out-of-slice range");
    PS_FUZZ_CHECK(h.chunk_count == ps::net::ChunkCount(kNumel, h.chunk_elems),
                  "accepted a chunk_count other than ChunkCount");
  } else {
    PS_FUZZ_CHECK(
        geometry.code() == absl::StatusCode::kInvalidArgument && !geometry.message().empty(),
        "CheckChunkGeometry refused without INVALID_ARGUMENT and a message");
  }

  std::string again;
  const absl::Status encoded =
      ps::net::EncodeDatagramWithNonce(h, view.nonce, view.codec, view.payload, key, &again);
  PS_FUZZ_CHECK(encoded.ok(), "EncodeDatagram refused the fields of a parsed datagram");
  auto reparsed = ps::net::ParseDatagram(again);
  PS_FUZZ_CHECK(reparsed.ok(), "ParseDatagram refused what EncodeDatagram wrote");
  PS_FUZZ_CHECK(
      reparsed->header == h && reparsed->codec == view.codec && reparsed->payload == view.payload,
      "re-encoding changed a field");
  PS_FUZZ_CHECK(key.Verify(reparsed->nonce, reparsed->signed_bytes, reparsed->mac),
                "EncodeDatagram wrote a MAC that does not verify");
  PS_FUZZ_CHECK(reparsed->signed_bytes == view.signed_bytes,
                "re-encoding changed a signed byte: the encoding is not unique");
  PS_FUZZ_CHECK((again == input) == verified,
                "the re-encoded datagram equals the input exactly when the input's MAC verified");
  return 0;
}
