#include "net/scratch_buffer.h"

namespace ps::net {

std::span<char> ScratchBuffer::Take(size_t bytes) {
  const bool small = capacity_ > kKeepBytes && bytes < capacity_ / 4;
  small_in_a_row_ = small ? small_in_a_row_ + 1 : 0;
  if (bytes > capacity_ || small_in_a_row_ >= kReleaseAfter) {
    data_.reset();  // before the new one: the two are never held at once
    data_ = std::make_unique_for_overwrite<char[]>(bytes);
    capacity_ = bytes;
    small_in_a_row_ = 0;
  }
  size_ = bytes;
  return std::span<char>(data_.get(), bytes);
}

}  // namespace ps::net
