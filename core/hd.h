// PS_HD marks a function that runs on the host and on a CUDA device, so one definition
// serves the CPU code and the GPU kernels (and is unit-tested on the CPU). Empty outside
// nvcc. Such functions use no library calls that device code lacks.
#pragma once

#if defined(__CUDACC__)
#define PS_HD __host__ __device__
#else
#define PS_HD
#endif

// `PS_UNROLL for (...)`: fully unrolled in device code (a loop with a trip count fixed
// at compile time, so arrays indexed by its variable stay in registers); a plain loop
// elsewhere (g++ has no `#pragma unroll`).
#if defined(__CUDA_ARCH__)
#define PS_UNROLL _Pragma("unroll")
#else
#define PS_UNROLL
#endif

namespace ps::core {

// Round-to-nearest float and double arithmetic that nvcc may not contract into fused
// multiply-adds, so device code computes the CPU's bits (g++ does not contract under
// -std=c++20). Plain operators on the host.
PS_HD inline float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
PS_HD inline float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
PS_HD inline double AddRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

}  // namespace ps::core
