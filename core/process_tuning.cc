#include "core/process_tuning.h"

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace ps::core {

void TuneProcessForThroughput() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ps::core
