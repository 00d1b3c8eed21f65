// Which sanitizer build a test is compiled in, for the tests whose bounds a sanitizer
// changes:
// - PS_SANITIZED: 1 under ASan or TSan from either compiler (GCC defines
//   __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__; clang 14, which builds the ASan
//   integration tests, answers through __has_feature): resident memory grows by the
//   shadow memory and the quarantine, so memory bounds widen, and assertions on
//   decisions made from measured timings may be left out.
// - PS_GCC_SANITIZED: 1 under GCC's ASan or TSan only, for thresholds widened to GCC's
//   -O1 builds, which decode several times slower: clang's ASan build meets most plain
//   bounds and not those (a decode budget widened to 200 ms was never reached); where it
//   does not, the test says so beside its bound.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PS_GCC_SANITIZED 1
#define PS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PS_SANITIZED 1
#endif
#endif
#ifndef PS_SANITIZED
#define PS_SANITIZED 0
#endif
#ifndef PS_GCC_SANITIZED
#define PS_GCC_SANITIZED 0
#endif
