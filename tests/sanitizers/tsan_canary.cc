// Checks that the TSan build sees what it should (docs/sanitizers.md), so a passing TSan
// run means something:
//   tsan_canary race    two threads write one int without a lock: TSan must report it
//                       (ctest expects this run to fail);
//   tsan_canary mutex   the same writes under an absl::Mutex (with Await): must be clean,
//                       which holds only while tests/sanitizers/tsan_absl_mutex.cc tells
//                       TSan about abseil's (uninstrumented) Mutex.
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {

int counter = 0;
absl::Mutex mu;
bool turn_done = false;

void Racy() {
  std::thread t([] { counter += 1; });
  counter += 1;
  t.join();
}

void Guarded() {
  std::thread t([] {
    absl::MutexLock lock(&mu);
    counter += 1;
    turn_done = true;
  });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&turn_done));
    counter += 1;
  }
  t.join();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "race") != 0 && std::strcmp(argv[1], "mutex") != 0)) {
    std::fprintf(stderr, "usage: tsan_canary race|mutex\n");
    return 2;
  }
  if (std::strcmp(argv[1], "race") == 0) {
    Racy();
  } else {
    Guarded();
  }
  std::printf("counter = %d\n", counter);
  return 0;
}
