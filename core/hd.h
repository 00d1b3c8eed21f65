// PS_HD marks a function that runs on the host and on a CUDA device, so one definition
// serves the CPU code and the GPU kernels (and is unit-tested on the CPU). Empty outside
// nvcc. Such functions use no library calls that device code lacks.
#pragma once

#if defined(__CUDACC__)
#define PS_HD __host__ __device__
#else
#define PS_HD
#endif
