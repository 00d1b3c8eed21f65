// Run-time choice of vector width for the hot kernels of aggregators and codecs. The
// build targets baseline x86-64 (SSE2); a kernel marked PS_VECTOR_CLONES is also
// compiled for AVX2 and the loader picks the best one the CPU has (GCC/Clang function
// multiversioning). Kernels written with AVX2 intrinsics instead are compiled under
// PS_HAVE_X86_SIMD, marked __attribute__((target("avx2"))), and called only when
// CpuHasAvx2() says so; each has a portable twin that gives identical results.
//
// Results do not depend on the clone: the kernels fix their summation order in code
// (independent accumulators, never reassociated), and every product they form is of two
// floats, exact in double, so fused multiply-adds round the same as separate ones.
//
// Thread safety: CpuHasAvx2() is safe from any thread (a function-local static).
#pragma once

// Clones are dispatched by an ifunc resolver, which the dynamic loader runs before the
// ThreadSanitizer runtime is initialised (it crashes there), so TSan builds use the
// default clone only; results do not depend on the clone (above).
#if defined(__SANITIZE_THREAD__)  // GCC
#define PS_THREAD_SANITIZER 1
#elif defined(__has_feature)  // Clang
#if __has_feature(thread_sanitizer)
#define PS_THREAD_SANITIZER 1
#endif
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(PS_NO_VECTOR_CLONES) && !defined(PS_THREAD_SANITIZER)
#define PS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PS_VECTOR_CLONES
#endif

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PS_HAVE_X86_SIMD 1
// Marks a kernel written with AVX2 intrinsics (called only where CpuHasAvx2()).
#define PS_TARGET_AVX2 __attribute__((target("avx2")))
#endif

namespace ps::core {

// Whether the CPU (and the OS, through __builtin_cpu_supports) runs AVX2 code.
inline bool CpuHasAvx2() {
#ifdef PS_HAVE_X86_SIMD
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return have;
#else
  return false;
#endif
}

}  // namespace ps::core
