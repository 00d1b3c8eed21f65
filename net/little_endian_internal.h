// Little-endian integers written and read byte by byte, so that the wire formats of
// net/ (udp_frame, data_frame) do not depend on the host's byte order and never cast a
// buffer to a struct. Callers check the bounds; these touch exactly `bytes` bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ps::net::internal {

// The low `bytes` (at most 8) bytes of v, least significant first.
inline void StoreLe(uint64_t v, size_t bytes, char* out) {
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline uint64_t LoadLe(const char* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  }
  return v;
}

}  // namespace ps::net::internal
