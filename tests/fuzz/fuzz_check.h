// PS_FUZZ_CHECK(cond, message): the assertion of fuzz targets. Always on (also in
// release builds), prints where it failed and aborts, which libFuzzer and the replay
// driver report as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#define PS_FUZZ_CHECK(cond, message)                                                        \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   message);                                                                \
      std::abort();                                                                         \
    }                                                                                       \
  } while (false)
