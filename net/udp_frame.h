// The datagram of the lossy UDP gradient path (docs/transport.md, "Datagram"): one
// chunk of one slice's gradient, encoded on its own with a codec, signed with the
// worker's per-session key.
// A datagram that fails any check here is dropped (and counted) by the receiver; nothing
// is ever retransmitted, so a chunk must make sense without its neighbours.
//
// Wire layout, all integers little-endian; header (56 bytes), codec, payload, MAC:
//
//   off size field
//   0   4   magic "PSU1"
//   4   1   version (kDatagramVersion)
//   5   1   codec_len, 1..kMaxDatagramCodecBytes
//   6   1   kind         0: a chunk of a push; 1: the end of a push (below)
//   7   1   reserved, 0
//   8   8   session_id   public id of the worker's session on the shard; selects the key
//   16  4   worker_id
//   20  4   slice_id
//   24  8   round
//   32  4   chunk_elems  E >= 1: chunk i covers [i*E, min((i+1)*E, numel)) of the slice
//   36  2   chunk_index  < chunk_count
//   38  2   chunk_count  >= 1
//   40  4   payload_len  exactly the bytes between codec and MAC
//   44  12  nonce        never the same twice under one key (DatagramKey::NextNonce)
//   56  codec_len bytes of codec spec, chars in [A-Za-z0-9_.,=()+ -]
//   ..  payload_len bytes: the chunk's values encoded with that codec
//   end-16: MAC = the GMAC tag (AES-256-GCM's tag with no plaintext, crypto/gmac.h) under
//           the session key and the nonce, with every byte before the MAC as additional
//           data
//
// An end datagram (kind 1) says that the worker has sent every chunk of its pushes of
// one or more slices for the round. Its header names the first push (slice_id and
// chunk_count, with the pushes' chunk_elems and codec, chunk_index 0); its payload names
// the others of the same round, chunk_elems and codec, kEndEntryBytes each:
//
//   0   4   slice_id
//   4   2   chunk_count  >= 1
//   6   2   reserved, 0
//
// A worker sends one end (and its copies) per shard and tensor: all of a push's slices
// to that shard. The shard closes a round once every worker's push is whole or ended
// (docs/transport.md, "Closing a round at the workers' ends"), instead of waiting for the
// deadline when chunks were lost. A shard of an earlier release, which reads the kind
// byte as part of a reserved field that must be 0 (or, until 2026-12-06, reads an end
// with a payload as malformed), drops such an end and closes those rounds at their
// deadline.
//
// Every field is fixed by the header struct, nonce, codec and payload, so an encoding is
// unique: re-encoding a parsed datagram with its nonce gives back its bytes (the fuzz
// target checks this).
//
// Version 1 (until 2026-11-26) had no nonce and an HMAC-SHA256 MAC; version 2 (until
// 2026-12-01) had this layout under a key that was the Join answer's secret itself;
// version 3 (until 2026-12-06) bound that secret to the worker's token (crypto::UdpKey),
// as version 4 does, and carried the Poly1305 tag of ChaCha20-Poly1305 (RFC 8439).
// Earlier versions are refused as unknown, so a worker and a shard of different
// releases see the version named rather than every datagram dropped as forged. GMAC
// runs at about 29 GB/s per core here with AVX-512's carry-less multiplies, where
// ChaCha20-Poly1305's tag ran at 8.5-9.2 and HMAC-SHA256 at 1.7 (docs/transport.md).
// Its price: a nonce repeated under a key would let a forger sign anything under that
// key, not only under that nonce, so nonces never repeat (DatagramKey::NextNonce).
//
// Ownership: DatagramView borrows the parsed buffer. Thread safety: the functions are
// pure; a DatagramKey may be used from any number of threads at once (its nonce counter
// is atomic).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::net {

inline constexpr uint8_t kDatagramVersion = 4;
inline constexpr size_t kDatagramHeaderBytes = 56;
inline constexpr size_t kDatagramNonceBytes = 12;
inline constexpr size_t kDatagramMacBytes = 16;
inline constexpr size_t kMaxDatagramBytes = 65507;  // largest IPv4 UDP payload
inline constexpr size_t kMaxDatagramCodecBytes = 64;
inline constexpr size_t kDatagramKeyBytes = 32;

// Bytes around a payload: header + codec + MAC.
size_t DatagramOverhead(size_t codec_bytes);

enum class DatagramKind : uint8_t {
  kChunk = 0,  // one chunk of a push: its values
  kEnd = 1,    // the end of a push: every chunk of it was sent
};

struct DatagramHeader {
  DatagramKind kind = DatagramKind::kChunk;
  uint64_t session_id = 0;
  uint32_t worker_id = 0;
  uint32_t slice_id = 0;
  uint64_t round = 0;
  uint32_t chunk_elems = 0;
  uint16_t chunk_index = 0;
  uint16_t chunk_count = 0;
  bool operator==(const DatagramHeader&) const = default;
};

using DatagramNonce = std::array<uint8_t, kDatagramNonceBytes>;

// A parsed datagram; the views point into the parsed buffer, which must outlive it.
struct DatagramView {
  DatagramHeader header;
  std::string_view nonce;  // kDatagramNonceBytes
  std::string_view codec;
  std::string_view payload;
  std::string_view signed_bytes;  // everything the MAC covers: the datagram minus the MAC
  std::string_view mac;           // kDatagramMacBytes
};

// A session's MAC key: kDatagramKeyBytes random bytes handed out at join over the
// authenticated channel. AES's round keys and the hash key's powers are computed once
// here (crypto::Gmac).
//
// Copies share the keyed state and the nonce counter. There is no move distinct from the
// copy, so a key is never empty, not even a moved-from one.
class DatagramKey {
 public:
  // A fresh key from OpenSSL's CSPRNG (RAND_bytes); INTERNAL when that fails.
  static absl::StatusOr<DatagramKey> Random();
  // INVALID_ARGUMENT unless `key` has exactly kDatagramKeyBytes bytes.
  static absl::StatusOr<DatagramKey> FromBytes(std::string_view key);

  DatagramKey(const DatagramKey&) = default;
  DatagramKey& operator=(const DatagramKey&) = default;

  // The raw key, to hand to the worker.
  std::string_view bytes() const;

  // A nonce this key (and every copy of it) never returned before: a random 32-bit
  // prefix drawn with the key object, then a 64-bit counter that starts at a random value.
  // Two key objects made from the same bytes collide only if both random draws do.
  DatagramNonce NextNonce() const;

  // The GMAC tag under this key and `nonce` (kDatagramNonceBytes bytes) of `data`. Where
  // the CPU lacks the fast path, OpenSSL computes it; OpenSSL failing (it can only run out
  // of memory) aborts, as operator new would.
  std::array<uint8_t, kDatagramMacBytes> Mac(std::string_view nonce, std::string_view data) const;

  // The tag of the concatenation of `pieces`, without concatenating them.
  std::array<uint8_t, kDatagramMacBytes> Mac(std::string_view nonce,
                                             std::span<const std::string_view> pieces) const;

  // Whether `mac` is Mac(nonce, data); compares in constant time, so a forger learns
  // nothing from timing. A `nonce` or `mac` of the wrong size is false.
  bool Verify(std::string_view nonce, std::string_view data, std::string_view mac) const;

 private:
  struct State;
  explicit DatagramKey(std::shared_ptr<const State> state);
  // Like Mac(); false when OpenSSL fails.
  bool ComputeMac(std::string_view nonce, std::span<const std::string_view> pieces,
                  std::array<uint8_t, kDatagramMacBytes>* out) const;

  std::shared_ptr<const State> state_;  // never null
};

// Writes one signed datagram, under a fresh key.NextNonce(), into *out, replacing its
// contents. INVALID_ARGUMENT when the
// codec is empty, longer than kMaxDatagramCodecBytes or has a character outside
// [A-Za-z0-9_.,=()+ -], when chunk_elems == 0, chunk_count == 0 or chunk_index >=
// chunk_count, for an end with a chunk_index other than 0 or a payload that is not whole
// entries with chunk_count >= 1 and reserved 0, or when the datagram would exceed
// kMaxDatagramBytes. The payload may be
// empty; what it must hold is the codec's business. codec and payload must not point into
// *out, which is resized before they are copied.
absl::Status EncodeDatagram(const DatagramHeader& header, std::string_view codec,
                            std::string_view payload, const DatagramKey& key, std::string* out);
// The same with a given nonce (tests and the fuzz target re-encode a parsed datagram);
// INVALID_ARGUMENT also for a nonce of another size. A sender must never reuse a nonce.
absl::Status EncodeDatagramWithNonce(const DatagramHeader& header, std::string_view nonce,
                                     std::string_view codec, std::string_view payload,
                                     const DatagramKey& key, std::string* out);

// A signed datagram in the pieces a scatter-gather send takes, so the payload is sent
// from where it lies: the datagram is `head` (header and codec), the payload, `mac`;
// EncodeDatagram writes the same bytes in one buffer.
struct SignedDatagram {
  std::string head;
  std::array<uint8_t, kDatagramMacBytes> mac{};
};
// EncodeDatagram's datagram for `payload`, in pieces: the same checks and errors. `out`
// holds no view of the payload.
absl::Status SignDatagram(const DatagramHeader& header, std::string_view codec,
                          std::string_view payload, const DatagramKey& key, SignedDatagram* out);
// The same for the payload that is the concatenation of `payload` (a borrowed push's
// head and the caller's values), signed without concatenating them.
absl::Status SignDatagram(const DatagramHeader& header, std::string_view codec,
                          std::span<const std::string_view> payload, const DatagramKey& key,
                          SignedDatagram* out);
// The same with a given nonce (tests).
absl::Status SignDatagramWithNonce(const DatagramHeader& header, std::string_view nonce,
                                   std::string_view codec, std::span<const std::string_view> payload,
                                   const DatagramKey& key, SignedDatagram* out);

// Structural parse without the MAC check (the caller looks the key up by session_id).
// INVALID_ARGUMENT, the message naming the failed check, for: a size below header + 1 +
// MAC or above kMaxDatagramBytes, bad magic, another version, codec_len 0 or above
// kMaxDatagramCodecBytes, an unknown kind, reserved != 0, payload_len not matching the
// size exactly, a codec character outside the set above, chunk_count == 0, chunk_index >=
// chunk_count, chunk_elems == 0, an end with a chunk_index other than 0 or a payload that
// is not whole entries with chunk_count >= 1 and reserved 0.
absl::StatusOr<DatagramView> ParseDatagram(std::string_view bytes);

// Ends of several pushes (above).
inline constexpr size_t kEndEntryBytes = 8;
// Appends the entry of the push of slice `slice_id` in `chunk_count` chunks to an end's
// payload.
void AppendEndEntry(uint32_t slice_id, uint16_t chunk_count, std::string* payload);
// The pushes an end ends, each as the header of a one-push end: `header`'s own first,
// then one per entry of `payload`, with its slice_id and chunk_count. For an end that
// ParseDatagram accepted (the payload is whole entries).
std::vector<DatagramHeader> EndedPushes(const DatagramHeader& header, std::string_view payload);
// How many pushes one end datagram with `codec_bytes` of codec can end.
size_t MaxEndedPushes(size_t codec_bytes);

// Chunk geometry shared by sender and receiver.

// ceil(numel / chunk_elems); 0 when chunk_elems == 0 (which no valid datagram has).
uint32_t ChunkCount(uint32_t numel, uint32_t chunk_elems);

// Bytes a chunk's codec may add to its values in the payload (a codec's own head: fp32's
// version byte, a scale), which ChunkElemsForMtu leaves room for.
inline constexpr size_t kChunkCodecHeadBytes = 16;

// The most fp32 values whose datagram, with a codec spec of `codec_bytes` and its head,
// fits in one IP packet of `mtu` bytes (IPv4's 20-byte header, or IPv6's 40, and UDP's 8
// taken off), and never above kMaxDatagramBytes: 16,353 on loopback (MTU 65,536) with
// "fp32", 345 on Ethernet (1,500). At least 1.
uint32_t ChunkElemsForMtu(size_t mtu, bool ipv6, size_t codec_bytes);

// OK when the header's chunk geometry fits a slice of `numel` coordinates: chunk_elems >=
// 1, chunk_count == ChunkCount(numel, chunk_elems), which must fit in 16 bits, and
// chunk_index < chunk_count. INVALID_ARGUMENT otherwise, saying which.
absl::Status CheckChunkGeometry(const DatagramHeader& header, uint32_t numel);

// The coordinates [first, first + count) of one chunk.
struct ChunkRange {
  uint32_t first = 0;
  uint32_t count = 0;
  bool operator==(const ChunkRange&) const = default;
};

// The range of chunk `index`; {numel, 0} for an index past the last chunk and {0, 0}
// when chunk_elems == 0, so that a caller skipping CheckChunkGeometry still stays inside
// the slice.
ChunkRange ChunkRangeOf(uint32_t numel, uint32_t chunk_elems, uint32_t index);

}  // namespace ps::net
