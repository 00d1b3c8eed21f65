// GMAC (NIST SP 800-38D, as RFC 4543 uses it): the tag of AES-256-GCM under a key and a
// 96-bit nonce with the message as additional data and nothing encrypted,
//
//   tag = GHASH_H(A || 0-pad to 16 || [8 * |A|]_64 || [0]_64) XOR AES_K(nonce || 0^31 || 1),
//   H = AES_K(0^128).
//
// The MAC of the lossy UDP path's datagrams (net/udp_frame.h). Two implementations give
// the same bytes:
//   - on x86-64 CPUs with AVX-512 (F, BW, VL), VPCLMULQDQ and AES-NI (checked once at run
//     time, the OS's saving of the vector state included), this file's own: GHASH over 32
//     blocks (512 bytes) per step, each multiplied by its power of H with carry-less
//     multiplies four blocks to a register, summed, and reduced once; AES by AES-NI.
//     About 29 GB/s per core here, where OpenSSL 3.0's GMAC ran at 11 and the
//     ChaCha20-Poly1305 tag at 8.5 (docs/transport.md);
//   - elsewhere OpenSSL's AES-256-GCM (TagWithOpenSsl), which the tests compare the first
//     with on every size and split.
// Both are constant-time in the key and the data (carry-less multiplies, AES-NI; no
// table lookups on secrets).
//
// A nonce must never repeat under a key: a repeat gives a forger what it needs to forge
// under every nonce of that key. The caller draws them (net::DatagramKey::NextNonce).
//
// Thread safety: Tag and TagWithOpenSsl are const and may run on any number of threads at
// once. Ownership: the key material lives in the object and is wiped when it goes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::crypto {

inline constexpr size_t kGmacKeyBytes = 32;    // AES-256
inline constexpr size_t kGmacNonceBytes = 12;  // 96 bits: J0 = nonce || 0^31 || 1
inline constexpr size_t kGmacTagBytes = 16;

using GmacTag = std::array<uint8_t, kGmacTagBytes>;

class Gmac {
 public:
  // INVALID_ARGUMENT unless `key` has kGmacKeyBytes bytes.
  static absl::StatusOr<Gmac> FromKey(std::string_view key);

  Gmac(Gmac&&) noexcept;
  Gmac& operator=(Gmac&&) noexcept;
  ~Gmac();

  // The tag of the concatenation of `pieces` (any sizes, empty ones too) under `nonce`
  // (kGmacNonceBytes bytes). False only where OpenSSL fails (it can only run out of
  // memory), which the fast path never calls.
  bool Tag(std::span<const uint8_t, kGmacNonceBytes> nonce,
           std::span<const std::string_view> pieces, GmacTag* out) const;

  // The same tag from OpenSSL's AES-256-GCM, whatever the CPU.
  bool TagWithOpenSsl(std::span<const uint8_t, kGmacNonceBytes> nonce,
                      std::span<const std::string_view> pieces, GmacTag* out) const;

  // Whether Tag runs this file's AVX-512 code on this CPU (else OpenSSL's).
  static bool FastPath();

 private:
  struct Keys;
  struct KeysDeleter {
    void operator()(Keys* keys) const;
  };
  explicit Gmac(std::unique_ptr<Keys, KeysDeleter> keys);

  std::unique_ptr<Keys, KeysDeleter> keys_;  // null only in a moved-from object
};

}  // namespace ps::crypto
