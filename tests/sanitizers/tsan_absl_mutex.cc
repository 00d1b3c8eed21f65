// ThreadSanitizer builds only (PS_SANITIZE=thread; docs/sanitizers.md): tells TSan about
// abseil's Mutex.
//
// Debian's abseil is compiled without -fsanitize=thread, so its Mutex synchronizes
// through atomics and futexes TSan never sees, and every field our code guards with an
// absl::Mutex would be reported as a race. These definitions interpose the Mutex entry
// points our code calls (the executable's definition wins over the shared library's):
// each calls the library's own function, found with dlsym(RTLD_NEXT), and adds the
// happens-before edge it implies, __tsan_release(mutex) before giving the mutex up and
// __tsan_acquire(mutex) after getting it. Nothing else changes: the library still does
// the locking.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

#define PS_STR2(x) #x
#define PS_STR(x) PS_STR2(x)

// The mangled name of absl::<inline namespace>::Mutex::<rest>, e.g. rest "4LockEv".
std::string MutexSymbol(const char* rest) {
  const std::string ns = PS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return "_ZN4absl" + std::to_string(ns.size()) + ns + "5Mutex" + rest;
}

template <typename Fn>
Fn Next(const char* rest) {
  const std::string name = MutexSymbol(rest);
  void* p = dlsym(RTLD_NEXT, name.c_str());
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found in abseil: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto real = Next<void (*)(Mutex*)>("4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::Unlock() {
  static const auto real = Next<void (*)(Mutex*)>("6UnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::TryLock() {
  static const auto real = Next<bool (*)(Mutex*)>("7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static const auto real = Next<void (*)(Mutex*)>("10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderUnlock() {
  static const auto real = Next<void (*)(Mutex*)>("12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real = Next<void (*)(Mutex*, const Condition&)>("8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}

void Mutex::Await(const Condition& cond) {
  static const auto real = Next<void (*)(Mutex*, const Condition&)>("5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, cond);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Next<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool met = real(this, cond, timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Next<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const bool met = real(this, cond, deadline);
  __tsan_acquire(this);
  return met;
}

ABSL_NAMESPACE_END
}  // namespace absl
