// ScratchBuffer: a data connection's buffer for bytes that have no place of their own (a
// coded push on the shard; a compressed slice, or a slice whose pull ended, on the
// worker). It grows to the largest body it is asked for, without zero-filling what it
// adds (every byte taken is read from the socket before it is used), and gives the
// memory back after kReleaseAfter takes in a row that each needed under a quarter of
// what it holds, once it holds over kKeepBytes: a connection that read one large frame
// does not hold that frame's size (up to the body limit) until it closes, and one whose
// bodies are steadily large or small keeps its buffer.
//
// Thread safety: none; a connection's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace ps::net {

class ScratchBuffer {
 public:
  static constexpr size_t kKeepBytes = 1u << 20;
  static constexpr uint32_t kReleaseAfter = 16;

  // `bytes` bytes, their contents unspecified, valid until the next Take.
  std::span<char> Take(size_t bytes);
  // The bytes the last Take gave.
  std::string_view view() const { return std::string_view(data_.get(), size_); }
  // What the buffer holds.
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
  size_t size_ = 0;
  uint32_t small_in_a_row_ = 0;
};

}  // namespace ps::net
