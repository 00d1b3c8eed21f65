// Run-time choice of vector width for the hot kernels. The build targets baseline
// x86-64 (SSE2); a kernel marked PS_VECTOR_CLONES is also compiled for AVX2 and the
// loader picks the best one the CPU has (GCC/Clang function multiversioning).
//
// Results do not depend on the clone: the kernels fix their summation order in code
// (independent accumulators, never reassociated), and every product they form is of two
// floats, exact in double, so fused multiply-adds round the same as separate ones.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(PS_NO_VECTOR_CLONES)
#define PS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PS_VECTOR_CLONES
#endif
