// The pull part of a shard's data connection (connection.h): the sink an open pull's
// scheduler writes slices into, which queues them on the connection's thread. Internal
// to server/transport/tcp: its definition is needed where a connection holds or frees
// its pulls (connection.cc) and where it opens them (connection_pull.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/shard_front.h"
#include "server/transport/tcp/connection.h"

namespace ps::server::transport::tcp {

// One open pull: the front's handle and the sink it writes into. The scheduler calls
// Write and Finish with its lock held, from any thread: both only post to the connection's
// thread. Slices of one pull queued at once (at least 2: the next is in the queue when a
// write completes), as many as the connection's pace allows (PullPace). The slices written
// before the connection's thread takes them reach it in one handler (Batch), so that they
// are queued together and leave as one SLICES.
class Connection::Pull final : public PullSink {
 public:
  Pull(std::weak_ptr<Connection> connection, uint64_t tag, size_t writes_in_flight)
      : connection_(std::move(connection)), tag_(tag), writes_in_flight_(writes_in_flight) {}
  ~Pull() override { handle_.reset(); }  // detaches this sink before it goes

  void Open(std::unique_ptr<PullHandle> handle) {
    handle_ = std::move(handle);
    handle_->Start(this);
  }
  PullHandle& handle() { return *handle_; }

  void Write(PullItem item) override;

  size_t writes_in_flight() const override { return writes_in_flight_; }

  void Finish(const absl::Status& status) override;

 private:
  // Slices written and not yet taken by the connection's thread; `posted`: a handler
  // that takes them is posted.
  struct Batch {
    absl::Mutex mu;
    std::vector<Outgoing> frames ABSL_GUARDED_BY(mu);
    bool posted ABSL_GUARDED_BY(mu) = false;
  };

  const std::weak_ptr<Connection> connection_;
  const uint64_t tag_;
  const size_t writes_in_flight_;
  const std::shared_ptr<Batch> batch_ = std::make_shared<Batch>();
  std::unique_ptr<PullHandle> handle_;
};

}  // namespace ps::server::transport::tcp
