// SendQueue: the P3 send queue of one shard (docs/transport.md, "P3: priority-ordered propagation"). Items wait
// ordered by (priority, round, arrival) — or by arrival alone in FIFO mode — and leave
// only while the bytes in flight stay within a window, so an urgent item queued late
// overtakes the ones still waiting, at item (slice) boundaries. The owner may resize the
// window as it goes (the push pipeline sizes it to the link). An owner that paces by
// other means takes one item at a time whatever the window (TakeNext: the UDP sender,
// whose token bucket paces its datagrams), so both paths share one order.
//
// Not thread-safe: the owner serializes calls (the Worker holds its shard's send lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace ps::internal {

template <typename T>
class SendQueue {
 public:
  // priority_order: false for FIFO. window: bytes in flight at most; an item larger than
  // the window still goes when nothing else is in flight.
  SendQueue(bool priority_order, uint64_t window)
      : priority_order_(priority_order), window_(window) {}

  // The window from now on: items already in flight stay, and the next TakeSendable
  // lets go what the new window admits.
  void set_window(uint64_t window) { window_ = window; }
  uint64_t window() const { return window_; }

  void Push(int32_t priority, uint64_t round, uint64_t bytes, T item) {
    const uint64_t seq = next_seq_++;
    const Key key = priority_order_ ? Key{priority, round, seq} : Key{0, 0, seq};
    queue_.emplace(key, Entry{bytes, std::move(item)});
  }

  // Removes and returns, most urgent first, the items the window lets go now, and
  // counts their bytes as in flight.
  std::vector<std::pair<uint64_t, T>> TakeSendable() {
    std::vector<std::pair<uint64_t, T>> out;
    while (!queue_.empty()) {
      auto it = queue_.begin();
      const uint64_t bytes = it->second.bytes;
      if (inflight_bytes_ > 0 && inflight_bytes_ + bytes > window_) break;
      inflight_bytes_ += bytes;
      out.emplace_back(bytes, std::move(it->second.item));
      queue_.erase(it);
    }
    return out;
  }

  // The bytes of the most urgent item, the one TakeNext would return; the queue must not
  // be empty.
  uint64_t next_bytes() const { return queue_.begin()->second.bytes; }

  // Removes and returns the most urgent item whatever the window, without counting it
  // in flight; the queue must not be empty.
  T TakeNext() {
    auto it = queue_.begin();
    T item = std::move(it->second.item);
    queue_.erase(it);
    return item;
  }

  // An item taken earlier is done: its bytes leave the window.
  void Release(uint64_t bytes) { inflight_bytes_ -= bytes; }

  // Empties the queue (shutdown); in-flight bytes are left as they are.
  std::vector<T> TakeAll() {
    std::vector<T> out;
    for (auto& [key, entry] : queue_) out.push_back(std::move(entry.item));
    queue_.clear();
    return out;
  }

  uint64_t inflight_bytes() const { return inflight_bytes_; }
  size_t size() const { return queue_.size(); }
  bool empty() const { return queue_.empty(); }

 private:
  using Key = std::tuple<int64_t, uint64_t, uint64_t>;
  struct Entry {
    uint64_t bytes = 0;
    T item;
  };

  const bool priority_order_;
  uint64_t window_;
  std::map<Key, Entry> queue_;
  uint64_t inflight_bytes_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace ps::internal
