// SHA-256 (FIPS 180-4) of a byte string, in portable C++: the layout hash
// (core/layout.h) is the first 8 bytes of one, and core/ links no cryptography library.
// It is a fingerprint here, not a secret's protection: nothing in it is constant-time,
// and keyed hashes, tokens and proofs are crypto/'s (OpenSSL).
//
// A pure function; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ps::core {

inline constexpr size_t kSha256Bytes = 32;

std::array<uint8_t, kSha256Bytes> Sha256(std::string_view data);

}  // namespace ps::core
