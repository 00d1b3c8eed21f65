#include "net/udp_frame.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/gmac.h"
#include "net/little_endian_internal.h"

namespace ps::net {
namespace {

using internal::LoadLe;
using internal::StoreLe;

constexpr char kMagic[4] = {'P', 'S', 'U', '1'};
constexpr size_t kNonceOffset = 44;
constexpr uint32_t kMaxChunkCount = 0xffff;

static_assert(kDatagramKeyBytes == crypto::kGmacKeyBytes && kDatagramNonceBytes == crypto::kGmacNonceBytes &&
                  kDatagramMacBytes == crypto::kGmacTagBytes,
              "the MAC is AES-256-GMAC: a 256-bit key, a 96-bit nonce, a 128-bit tag");
static_assert(kNonceOffset + kDatagramNonceBytes == kDatagramHeaderBytes);
static_assert(kMaxDatagramCodecBytes <= 0xff, "codec_len is one byte");
static_assert(kMaxDatagramBytes <= 0xffffffffu, "payload_len is four bytes");

bool IsCodecChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::strchr("_.,=()+ -", c) != nullptr;
}

// The checks EncodeDatagram and ParseDatagram share, with the same messages.
absl::Status CheckCodec(std::string_view codec) {
  if (codec.empty() || codec.size() > kMaxDatagramCodecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp datagram: codec_len ", codec.size(), " is outside [1, ", kMaxDatagramCodecBytes, "]"));
  }
  for (size_t i = 0; i < codec.size(); ++i) {
    // '\0' would make strchr match the terminator.
    if (codec[i] == '\0' || !IsCodecChar(codec[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("udp datagram: codec byte ", i, " (0x",
                       absl::Hex(static_cast<uint8_t>(codec[i]), absl::kZeroPad2),
                       ") is not in [A-Za-z0-9_.,=()+ -]"));
    }
  }
  return absl::OkStatus();
}

std::string_view AsView(const DatagramNonce& nonce) {
  return std::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size());
}

// An end's entry (net/udp_frame.h): where its fields lie.
constexpr size_t kEntrySliceAt = 0, kEntryCountAt = 4, kEntryReservedAt = 6;

// `payload`: a chunk's values, or an end's further pushes (kEndEntryBytes each).
absl::Status CheckChunkFields(const DatagramHeader& header, std::string_view payload) {
  if (header.kind == DatagramKind::kEnd) {
    if (header.chunk_index != 0 || payload.size() % kEndEntryBytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "udp datagram: an end carries chunk_index 0 and ", kEndEntryBytes,
          " payload bytes per further push, not chunk_index ", header.chunk_index, " and ",
          payload.size(), " payload bytes"));
    }
    for (size_t i = 0; i < payload.size() / kEndEntryBytes; ++i) {
      const char* e = payload.data() + i * kEndEntryBytes;
      if (LoadLe(e + kEntryCountAt, 2) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("udp datagram: entry ", i, " of an end has chunk_count 0"));
      }
      if (const uint64_t reserved = LoadLe(e + kEntryReservedAt, 2); reserved != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "udp datagram: entry ", i, " of an end has reserved ", reserved, ", must be 0"));
      }
    }
  }
  if (header.chunk_count == 0) return absl::InvalidArgumentError("udp datagram: chunk_count is 0");
  if (header.chunk_index >= header.chunk_count) {
    return absl::InvalidArgumentError(absl::StrCat("udp datagram: chunk_index ", header.chunk_index,
                                                   " is not below chunk_count ",
                                                   header.chunk_count));
  }
  if (header.chunk_elems == 0) return absl::InvalidArgumentError("udp datagram: chunk_elems is 0");
  return absl::OkStatus();
}

}  // namespace

size_t DatagramOverhead(size_t codec_bytes) {
  return kDatagramHeaderBytes + codec_bytes + kDatagramMacBytes;
}

struct DatagramKey::State {
  explicit State(crypto::Gmac g) : gmac(std::move(g)) {}
  ~State() { OPENSSL_cleanse(key.data(), key.size()); }

  std::array<uint8_t, kDatagramKeyBytes> key{};
  crypto::Gmac gmac;  // keyed with `key`
  uint32_t nonce_prefix = 0;
  mutable std::atomic<uint64_t> nonce_counter{0};
};

DatagramKey::DatagramKey(std::shared_ptr<const State> state) : state_(std::move(state)) {}

absl::StatusOr<DatagramKey> DatagramKey::FromBytes(std::string_view key) {
  if (key.size() != kDatagramKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("udp datagram key must have ", kDatagramKeyBytes, " bytes, got ", key.size()));
  }
  absl::StatusOr<crypto::Gmac> gmac = crypto::Gmac::FromKey(key);
  if (!gmac.ok()) return gmac.status();
  auto state = std::make_shared<State>(*std::move(gmac));
  std::memcpy(state->key.data(), key.data(), key.size());
  uint64_t counter = 0;
  const bool ok = RAND_bytes(reinterpret_cast<unsigned char*>(&state->nonce_prefix),
                             sizeof(state->nonce_prefix)) == 1 &&
                  RAND_bytes(reinterpret_cast<unsigned char*>(&counter), sizeof(counter)) == 1;
  if (!ok) return absl::InternalError("udp datagram key: RAND_bytes failed");
  state->nonce_counter.store(counter);
  return DatagramKey(std::move(state));
}

absl::StatusOr<DatagramKey> DatagramKey::Random() {
  std::array<uint8_t, kDatagramKeyBytes> key;
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) {
    return absl::InternalError("udp datagram key: RAND_bytes failed");
  }
  absl::StatusOr<DatagramKey> made =
      FromBytes(std::string_view(reinterpret_cast<const char*>(key.data()), key.size()));
  OPENSSL_cleanse(key.data(), key.size());
  return made;
}

std::string_view DatagramKey::bytes() const {
  return std::string_view(reinterpret_cast<const char*>(state_->key.data()), state_->key.size());
}

DatagramNonce DatagramKey::NextNonce() const {
  DatagramNonce nonce;
  const uint64_t counter = state_->nonce_counter.fetch_add(1, std::memory_order_relaxed);
  StoreLe(state_->nonce_prefix, 4, reinterpret_cast<char*>(nonce.data()));
  StoreLe(counter, 8, reinterpret_cast<char*>(nonce.data()) + 4);
  return nonce;
}

bool DatagramKey::ComputeMac(std::string_view nonce, std::span<const std::string_view> pieces,
                             std::array<uint8_t, kDatagramMacBytes>* out) const {
  if (nonce.size() != kDatagramNonceBytes) return false;
  return state_->gmac.Tag(
      std::span<const uint8_t, kDatagramNonceBytes>(
          reinterpret_cast<const uint8_t*>(nonce.data()), kDatagramNonceBytes),
      pieces, out);
}

std::array<uint8_t, kDatagramMacBytes> DatagramKey::Mac(
    std::string_view nonce, std::span<const std::string_view> pieces) const {
  std::array<uint8_t, kDatagramMacBytes> mac;
  if (!ComputeMac(nonce, pieces, &mac)) {
    std::fprintf(stderr, "udp datagram: OpenSSL failed to compute the GMAC tag\n");
    std::abort();
  }
  return mac;
}

std::array<uint8_t, kDatagramMacBytes> DatagramKey::Mac(std::string_view nonce,
                                                        std::string_view data) const {
  return Mac(nonce, std::span<const std::string_view>(&data, 1));
}

bool DatagramKey::Verify(std::string_view nonce, std::string_view data,
                         std::string_view mac) const {
  if (mac.size() != kDatagramMacBytes || nonce.size() != kDatagramNonceBytes) return false;
  std::array<uint8_t, kDatagramMacBytes> expected;
  if (!ComputeMac(nonce, std::span<const std::string_view>(&data, 1), &expected)) return false;
  return CRYPTO_memcmp(expected.data(), mac.data(), expected.size()) == 0;
}

absl::Status EncodeDatagram(const DatagramHeader& header, std::string_view codec,
                            std::string_view payload, const DatagramKey& key, std::string* out) {
  const DatagramNonce nonce = key.NextNonce();
  return EncodeDatagramWithNonce(header, AsView(nonce), codec, payload, key, out);
}

absl::Status EncodeDatagramWithNonce(const DatagramHeader& header, std::string_view nonce,
                                     std::string_view codec, std::string_view payload,
                                     const DatagramKey& key, std::string* out) {
  SignedDatagram parts;
  PS_RETURN_IF_ERROR(SignDatagramWithNonce(header, nonce, codec,
                                           std::span<const std::string_view>(&payload, 1), key,
                                           &parts));
  // The payload is copied after the head is built: it must not point into *out, which
  // is resized before it is.
  out->resize(parts.head.size() + payload.size() + kDatagramMacBytes);
  char* p = out->data();
  std::memcpy(p, parts.head.data(), parts.head.size());
  p += parts.head.size();
  // An empty payload may have a null data(); memcpy must not see it, even for 0 bytes.
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  std::memcpy(p + payload.size(), parts.mac.data(), parts.mac.size());
  return absl::OkStatus();
}

absl::Status SignDatagram(const DatagramHeader& header, std::string_view codec,
                          std::string_view payload, const DatagramKey& key, SignedDatagram* out) {
  return SignDatagram(header, codec, std::span<const std::string_view>(&payload, 1), key, out);
}

absl::Status SignDatagram(const DatagramHeader& header, std::string_view codec,
                          std::span<const std::string_view> payload, const DatagramKey& key,
                          SignedDatagram* out) {
  const DatagramNonce nonce = key.NextNonce();
  return SignDatagramWithNonce(header, AsView(nonce), codec, payload, key, out);
}

absl::Status SignDatagramWithNonce(const DatagramHeader& header, std::string_view nonce,
                                   std::string_view codec, std::span<const std::string_view> payload,
                                   const DatagramKey& key, SignedDatagram* out) {
  if (nonce.size() != kDatagramNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("udp datagram: a nonce has ",
                                                   kDatagramNonceBytes, " bytes, got ",
                                                   nonce.size()));
  }
  PS_RETURN_IF_ERROR(CheckCodec(codec));
  // The head, then the payload's pieces (a datagram has at most a few).
  std::string_view signed_pieces[4];
  if (payload.size() + 1 > std::size(signed_pieces)) {
    return absl::InvalidArgumentError(absl::StrCat("udp datagram: a payload in ", payload.size(),
                                                   " pieces; at most ",
                                                   std::size(signed_pieces) - 1));
  }
  size_t payload_bytes = 0;
  for (std::string_view piece : payload) payload_bytes += piece.size();
  // An end's entries are checked whole (ends are small and come in one piece; a chunk's
  // fields do not look at its payload beyond its size).
  if (header.kind == DatagramKind::kEnd && payload.size() > 1) {
    std::string whole;
    for (std::string_view piece : payload) whole.append(piece);
    PS_RETURN_IF_ERROR(CheckChunkFields(header, whole));
  } else {
    PS_RETURN_IF_ERROR(
        CheckChunkFields(header, payload.empty() ? std::string_view() : payload[0]));
  }
  const size_t overhead = DatagramOverhead(codec.size());
  if (payload_bytes > kMaxDatagramBytes - overhead) {
    return absl::InvalidArgumentError(
        absl::StrCat("udp datagram: ", payload_bytes, " payload bytes with ", overhead,
                     " bytes of header, codec and MAC exceed ", kMaxDatagramBytes, " bytes"));
  }
  std::string& head = out->head;
  head.resize(kDatagramHeaderBytes + codec.size());
  char* p = head.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  StoreLe(kDatagramVersion, 1, p + 4);
  StoreLe(codec.size(), 1, p + 5);
  StoreLe(static_cast<uint8_t>(header.kind), 1, p + 6);
  StoreLe(0, 1, p + 7);
  StoreLe(header.session_id, 8, p + 8);
  StoreLe(header.worker_id, 4, p + 16);
  StoreLe(header.slice_id, 4, p + 20);
  StoreLe(header.round, 8, p + 24);
  StoreLe(header.chunk_elems, 4, p + 32);
  StoreLe(header.chunk_index, 2, p + 36);
  StoreLe(header.chunk_count, 2, p + 38);
  StoreLe(payload_bytes, 4, p + 40);
  std::memcpy(p + kNonceOffset, nonce.data(), nonce.size());
  std::memcpy(p + kDatagramHeaderBytes, codec.data(), codec.size());
  signed_pieces[0] = head;
  std::copy(payload.begin(), payload.end(), signed_pieces + 1);
  out->mac = key.Mac(nonce, std::span<const std::string_view>(signed_pieces, payload.size() + 1));
  return absl::OkStatus();
}

absl::StatusOr<DatagramView> ParseDatagram(std::string_view bytes) {
  const size_t min_size = DatagramOverhead(1);
  if (bytes.size() < min_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp datagram: ", bytes.size(), " bytes is too short (at least ", min_size, ")"));
  }
  if (bytes.size() > kMaxDatagramBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp datagram: ", bytes.size(), " bytes is too long (at most ", kMaxDatagramBytes, ")"));
  }
  const char* p = bytes.data();
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("udp datagram: bad magic (not PSU1)");
  }
  if (const uint64_t version = LoadLe(p + 4, 1); version != kDatagramVersion) {
    return absl::InvalidArgumentError(absl::StrCat("udp datagram: unknown version ", version,
                                                   " (this build reads ", kDatagramVersion, ")"));
  }
  const size_t codec_len = LoadLe(p + 5, 1);
  if (codec_len == 0 || codec_len > kMaxDatagramCodecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp datagram: codec_len ", codec_len, " is outside [1, ", kMaxDatagramCodecBytes, "]"));
  }
  const uint64_t kind = LoadLe(p + 6, 1);
  if (kind > static_cast<uint8_t>(DatagramKind::kEnd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("udp datagram: unknown kind ", kind, " (0: chunk, 1: end)"));
  }
  if (const uint64_t reserved = LoadLe(p + 7, 1); reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("udp datagram: reserved is ", reserved, ", must be 0"));
  }
  // Compared in 64 bits: a hostile payload_len near 2^32 must not wrap a sum.
  const uint64_t payload_len = LoadLe(p + 40, 4);
  if (DatagramOverhead(codec_len) + payload_len != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp datagram: payload_len ", payload_len, " does not match the size: ", bytes.size(),
        " bytes with codec_len ", codec_len, " leave ",
        static_cast<int64_t>(bytes.size()) - static_cast<int64_t>(DatagramOverhead(codec_len)),
        " for the payload"));
  }
  DatagramView view;
  view.codec = bytes.substr(kDatagramHeaderBytes, codec_len);
  PS_RETURN_IF_ERROR(CheckCodec(view.codec));
  DatagramHeader& h = view.header;
  h.kind = static_cast<DatagramKind>(kind);
  h.session_id = LoadLe(p + 8, 8);
  h.worker_id = static_cast<uint32_t>(LoadLe(p + 16, 4));
  h.slice_id = static_cast<uint32_t>(LoadLe(p + 20, 4));
  h.round = LoadLe(p + 24, 8);
  h.chunk_elems = static_cast<uint32_t>(LoadLe(p + 32, 4));
  h.chunk_index = static_cast<uint16_t>(LoadLe(p + 36, 2));
  h.chunk_count = static_cast<uint16_t>(LoadLe(p + 38, 2));
  view.payload = bytes.substr(kDatagramHeaderBytes + codec_len, payload_len);
  PS_RETURN_IF_ERROR(CheckChunkFields(h, view.payload));
  const size_t signed_size = bytes.size() - kDatagramMacBytes;
  view.nonce = bytes.substr(kNonceOffset, kDatagramNonceBytes);
  view.signed_bytes = bytes.substr(0, signed_size);
  view.mac = bytes.substr(signed_size);
  return view;
}

void AppendEndEntry(uint32_t slice_id, uint16_t chunk_count, std::string* payload) {
  char entry[kEndEntryBytes] = {};
  StoreLe(slice_id, 4, entry + kEntrySliceAt);
  StoreLe(chunk_count, 2, entry + kEntryCountAt);
  payload->append(entry, kEndEntryBytes);
}

std::vector<DatagramHeader> EndedPushes(const DatagramHeader& header, std::string_view payload) {
  std::vector<DatagramHeader> pushes(1 + payload.size() / kEndEntryBytes, header);
  for (size_t i = 1; i < pushes.size(); ++i) {
    const char* e = payload.data() + (i - 1) * kEndEntryBytes;
    pushes[i].slice_id = static_cast<uint32_t>(LoadLe(e + kEntrySliceAt, 4));
    pushes[i].chunk_count = static_cast<uint16_t>(LoadLe(e + kEntryCountAt, 2));
  }
  return pushes;
}

size_t MaxEndedPushes(size_t codec_bytes) {
  return 1 + (kMaxDatagramBytes - DatagramOverhead(codec_bytes)) / kEndEntryBytes;
}

uint32_t ChunkCount(uint32_t numel, uint32_t chunk_elems) {
  if (chunk_elems == 0) return 0;
  return numel / chunk_elems + (numel % chunk_elems != 0 ? 1 : 0);
}

uint32_t ChunkElemsForMtu(size_t mtu, bool ipv6, size_t codec_bytes) {
  const size_t headers = (ipv6 ? 40 : 20) + 8;
  const size_t datagram = std::min(kMaxDatagramBytes, mtu > headers ? mtu - headers : 0);
  const size_t around = DatagramOverhead(codec_bytes) + kChunkCodecHeadBytes;
  return static_cast<uint32_t>(
      std::max<size_t>(1, datagram > around ? (datagram - around) / sizeof(float) : 0));
}

absl::Status CheckChunkGeometry(const DatagramHeader& header, uint32_t numel) {
  if (header.chunk_elems == 0) return absl::InvalidArgumentError("udp datagram: chunk_elems is 0");
  const uint32_t count = ChunkCount(numel, header.chunk_elems);
  if (count > kMaxChunkCount) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp datagram: a slice of ", numel, " coordinates in chunks of ", header.chunk_elems,
        " needs ", count, " chunks; at most ", kMaxChunkCount, " fit in chunk_count"));
  }
  if (header.chunk_count != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("udp datagram: chunk_count ", header.chunk_count, ", but a slice of ", numel,
                     " coordinates in chunks of ", header.chunk_elems, " has ", count));
  }
  if (header.chunk_index >= header.chunk_count) {
    return absl::InvalidArgumentError(absl::StrCat("udp datagram: chunk_index ", header.chunk_index,
                                                   " is not below chunk_count ",
                                                   header.chunk_count));
  }
  return absl::OkStatus();
}

ChunkRange ChunkRangeOf(uint32_t numel, uint32_t chunk_elems, uint32_t index) {
  if (chunk_elems == 0) return {};
  const uint64_t first = static_cast<uint64_t>(index) * chunk_elems;
  if (first >= numel) return {numel, 0};
  return {static_cast<uint32_t>(first),
          static_cast<uint32_t>(std::min<uint64_t>(chunk_elems, numel - first))};
}

}  // namespace ps::net
