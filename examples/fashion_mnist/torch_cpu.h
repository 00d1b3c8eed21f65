// How libtorch's CPU math runs for workers that train as threads of one process: one
// torch and OpenBLAS thread per caller, and the system BLAS that libtorch's matrix
// products call, checked (Debian's libtorch uses libblas.so.3, chosen by
// update-alternatives). Free of torch's headers, so that launchers (trainer_main.cc,
// cluster.cc) do not parse them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ps::fashion_mnist {

// Real path of the shared library whose sgemm_ libtorch's CPU matrix products call
// (Debian's libtorch uses the system libblas.so.3, chosen by update-alternatives), or
// empty when the process has no such symbol.
std::string BlasLibraryPath();

// Whether `path` is Debian's reference BLAS (.../blas/libblas.so.3, the netlib
// implementation): training on it runs about 3x slower than on OpenBLAS.
bool IsReferenceBlas(std::string_view path);

// Whether `path` is Debian's single-threaded OpenBLAS (.../openblas-serial/, package
// libopenblas0-serial 0.3.21, built without OpenBLAS's USE_LOCKING): it returns wrong
// matrix products when several threads call it at once (docs/examples.md), so it must
// not serve workers that train as threads of one process.
bool IsThreadUnsafeBlas(std::string_view path);

// Sets torch and OpenBLAS to one thread per caller (the workers run in parallel, and a
// run repeats exactly) and, once per process, warns on stderr when the BLAS is the
// reference one, naming the package that replaces it. `threads` is how many workers
// train as threads of this process: above 1, a BLAS that is not safe to call from
// several threads at once is refused (FAILED_PRECONDITION naming the package to
// install) instead of training on wrong products.
absl::Status ConfigureTorchForWorkers(uint32_t threads);

}  // namespace ps::fashion_mnist
