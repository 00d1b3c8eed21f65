// Per-thread scratch buffers for the data path: reused from call to call on a thread
// and never initialized, so that a hot loop neither allocates nor zero-fills
// (docs/data_path.md). Each `Tag` type names one buffer: two uses that can be live at
// once on one thread need two tags (ThreadScratch), or a lease that gives a nested use
// buffers of its own (ThreadRows).
//
// Ownership: the buffer belongs to the thread and lives until it exits; it keeps the
// largest size asked for (a slice, at most). Thread safety: per thread by construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

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

// A lease on the calling thread's float rows named by `Tag`, for one job that may nest:
// the thread's rows, reused from lease to lease (they stay in its caches and are not
// allocated again), or rows of the lease's own when the thread's are leased further up
// its stack. Rows are never initialized. When the thread's lease ends, the thread keeps
// its rows up to KeptBytes in all, in order, and frees the rest. Lives on the stack of
// the thread that made it.
template <typename Tag, size_t KeptBytes = SIZE_MAX>
class ThreadRows {
 public:
  static constexpr size_t kKeptBytes = KeptBytes;

  ThreadRows() : rows_(Thread().in_use ? &own_ : &Thread()) { rows_->in_use = true; }
  ~ThreadRows() {
    Rows& r = *rows_;
    r.in_use = false;
    if (rows_ == &own_) return;
    size_t bytes = 0;
    size_t keep = 0;
    while (keep < r.rows.size() && r.capacity[keep] * sizeof(float) <= KeptBytes - bytes) {
      bytes += r.capacity[keep] * sizeof(float);
      ++keep;
    }
    r.rows.resize(keep);
    r.capacity.resize(keep);
  }
  ThreadRows(const ThreadRows&) = delete;
  ThreadRows& operator=(const ThreadRows&) = delete;

  // Row i, numel floats (contents unspecified), valid while this lives.
  std::span<float> Take(size_t i, size_t numel) {
    Rows& r = *rows_;
    if (r.rows.size() <= i) {
      r.rows.resize(i + 1);
      r.capacity.resize(i + 1, 0);
    }
    if (r.capacity[i] < numel) {
      r.rows[i].reset(new float[numel]);  // default-initialized: not zeroed
      r.capacity[i] = numel;
    }
    return {r.rows[i].get(), numel};
  }

  // The bytes of the rows the calling thread keeps between leases.
  static size_t ThreadKeptBytes() {
    size_t bytes = 0;
    for (size_t c : Thread().capacity) bytes += c * sizeof(float);
    return bytes;
  }

 private:
  struct Rows {
    std::vector<std::unique_ptr<float[]>> rows;
    std::vector<size_t> capacity;
    bool in_use = false;
  };
  static Rows& Thread() {
    thread_local Rows rows;
    return rows;
  }

  Rows own_;
  Rows* rows_;
};

}  // namespace ps::core
