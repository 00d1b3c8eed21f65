// The deadlines of the worker's data connection (connection_internal.h): every 100 ms
// while a call waits, the sweep fails what passed its deadline. A frame being read holds
// the stream: a pull late while its slices are read into the caller's places, or any
// call late behind a frame that stopped mid-way, closes the connection instead; so does
// a push late while the write under way still carries its bytes.
#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker_lib/transport/tcp/connection_internal.h"

namespace ps::internal::tcp_plane {
namespace {

constexpr auto kSweepPeriod = std::chrono::milliseconds(100);
// A frame the shard began and then sent no byte of for this long, while a call waiting on
// the connection passed its deadline, closes the connection (Stalled).
constexpr auto kFrameStallPeriod = std::chrono::seconds(1);

}  // namespace

bool Connection::ReadingPastItsDeadline(RpcClock::time_point now) {
  if (reading_tag_ == 0) return false;
  auto it = pulls_.find(reading_tag_);
  if (it == pulls_.end() || it->second.deadline > now) return false;
  // The body being read goes into the caller's buffer, and a read under way cannot be
  // pointed elsewhere: the connection closes (no byte lands in the buffer after that),
  // then the pull fails. What else the connection carried fails as a lost connection
  // does, and is retried; a shard that stops mid-frame so holds a pull no longer than
  // its deadline.
  const uint64_t tag = reading_tag_;
  std::shared_ptr<PullSink> sink = std::move(it->second.sink);
  pulls_.erase(it);
  Lost(absl::UnavailableError(
      absl::StrCat("the data connection to ", Name(),
                   " was closed: a pull's deadline passed mid-way through its slices")));
  sink->Done(absl::DeadlineExceededError(absl::StrCat(
      "deadline passed while ", Name(), " was sending pull ", tag,
      "'s slices (stalled mid-frame; the data connection was closed)")));
  return true;
}

bool Connection::WritingPastItsDeadline(RpcClock::time_point now) {
  for (const uint64_t tag : writing_tags_) {
    auto it = pushes_.find(tag);
    if (it == pushes_.end() || it->second.deadline > now) continue;
    PendingPush p = std::move(it->second);
    pushes_.erase(it);
    p.batch->tags[p.index] = 0;
    Lost(absl::UnavailableError(
        absl::StrCat("the data connection to ", Name(),
                     " was closed: a push's deadline passed while its bytes were being written")));
    p.batch->done(p.index, absl::DeadlineExceededError(absl::StrCat(
                               "deadline passed while push ", tag, " was being written to ",
                               Name(), " (the data connection was closed)")));
    return true;
  }
  return false;
}

bool Connection::Stalled(RpcClock::time_point now) {
  if (!frame_open_ || socket_ == nullptr) {
    stall_progress_.reset();
    return false;
  }
  // Progress: a read that completed, or bytes the socket holds that no read took yet
  // (a read may wait for a low-water mark).
  boost::system::error_code ec;
  const std::pair<uint64_t, size_t> progress{reads_, socket_->socket().available(ec)};
  const auto steady = std::chrono::steady_clock::now();
  if (!stall_progress_.has_value() || *stall_progress_ != progress) {
    stall_progress_ = progress;
    stall_since_ = steady;
    return false;
  }
  if (steady - stall_since_ < kFrameStallPeriod) return false;
  const auto late = [now](const auto& entry) { return entry.second.deadline <= now; };
  if (std::none_of(pushes_.begin(), pushes_.end(), late) &&
      std::none_of(pulls_.begin(), pulls_.end(), late)) {
    return false;
  }
  // Whatever waits on the connection waits behind the frame: it would wait there for
  // ever, and every call after it too.
  Lost(absl::UnavailableError(absl::StrCat(
      "the data connection to ", Name(), " was closed: ", Name(), " sent part of a ",
      core::AsAbsl(net::FrameTypeName(header_.type)), " frame and nothing more for ",
      std::chrono::duration_cast<std::chrono::milliseconds>(steady - stall_since_).count(),
      " ms while a call waiting on the connection passed its deadline")));
  return true;
}

void Connection::ScheduleSweep() {
  sweep_timer_ = std::make_unique<asio::steady_timer>(io_, kSweepPeriod);
  auto self = shared_from_this();
  sweep_timer_->async_wait([self](const boost::system::error_code& ec) {
    if (ec) return;
    const RpcClock::time_point now = RpcClock::now();
    if (self->ReadingPastItsDeadline(now) || self->WritingPastItsDeadline(now) ||
        self->Stalled(now)) {
      self->sweeping_ = false;
      return;
    }
    std::vector<uint64_t> late_pushes, late_pulls;
    for (const auto& [tag, p] : self->pushes_) {
      if (p.deadline <= now) late_pushes.push_back(tag);
    }
    for (const auto& [tag, p] : self->pulls_) {
      if (p.deadline <= now && tag != self->reading_tag_) late_pulls.push_back(tag);
    }
    const absl::Status late = absl::DeadlineExceededError(
        absl::StrCat("deadline passed waiting for ", self->Name()));
    // A late push still queued is not sent any more: its retry goes as a new push.
    self->DropQueuedPushes(late_pushes);
    for (uint64_t tag : late_pushes) {
      auto it = self->pushes_.find(tag);
      PendingPush p = std::move(it->second);
      self->pushes_.erase(it);
      p.batch->tags[p.index] = 0;
      p.batch->done(p.index, late);
    }
    for (uint64_t tag : late_pulls) self->EndPull(tag, late, /*cancel=*/true);
    self->sweeping_ = !self->pushes_.empty() || !self->pulls_.empty();
    if (self->sweeping_) self->ScheduleSweep();
  });
}

}  // namespace ps::internal::tcp_plane
