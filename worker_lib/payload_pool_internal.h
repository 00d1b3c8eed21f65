// PayloadPool: the strings one tensor's pushes are encoded into, reused. A sent payload
// is shared by whatever may still send it (the send queue, a retry, a resend after a
// rejoin); when its last reference goes, its string comes back here, still as long as
// it was, and a later round's encode writes into it. The fp32 codec then copies and
// checks the values in one pass into memory that is already the payload's length,
// instead of building a new string (which growing would zero-fill first; see
// codecs/fp32.cc), and no round allocates its payloads again (docs/data_path.md).
//
// Thread-safe: the last reference to a payload may go on any thread (a connection's, a
// gRPC one's); that thread gives the string back under the pool's lock.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::internal {

class PayloadPool : public std::enable_shared_from_this<PayloadPool> {
 public:
  // Sets payloads to `n` strings, the pool's free ones first (their old bytes left in
  // them), then empty ones. The pool keeps at most as many free strings as the largest
  // `n` asked for, so that what it holds is one round's payloads of the tensor.
  void Take(size_t n, std::vector<std::string>* payloads);

  // `payload`, shared; its string comes back to the pool when the last reference goes.
  std::shared_ptr<const std::string> Share(std::string payload);

  size_t free_count() const;

 private:
  void Give(std::string* payload);

  mutable absl::Mutex mu_;
  size_t max_free_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::internal
