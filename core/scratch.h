// Per-thread scratch buffers for the data path: reused from call to call on a thread
// and never initialized, so that a hot loop neither allocates nor zero-fills
// (docs/data_path.md). Each `Tag` type names one buffer: two uses that can be live at
// once on one thread need two tags.
//
// Ownership: the buffer belongs to the thread and lives until it exits; it keeps the
// largest size asked for (a slice, at most). Thread safety: per thread by construction.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>

namespace ps::core {

template <typename T, typename Tag>
std::span<T> ThreadScratch(size_t n) {
  static_assert(std::is_trivially_default_constructible_v<T>, "scratch is not initialized");
  thread_local std::unique_ptr<T[]> buffer;
  thread_local size_t capacity = 0;
  if (n > capacity) {
    buffer.reset(new T[n]);  // default-initialized: no zero fill
    capacity = n;
  }
  return std::span<T>(buffer.get(), n);
}

}  // namespace ps::core
