#include "cli/process_tuning.h"

#include <malloc.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace ps::cli {

void TuneProcessForThroughput() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // One heap for every thread, unless the environment asks otherwise: a thread's own
  // arena deletes (unmaps) a sub-heap as soon as it is empty, whatever the trim
  // threshold, so the buffers of a round came back as fresh pages.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 1);
#endif
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ps::cli
