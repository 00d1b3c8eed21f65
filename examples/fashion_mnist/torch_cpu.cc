#include "examples/fashion_mnist/torch_cpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace ps::fashion_mnist {

std::string BlasLibraryPath() {
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info;
  if (sgemm == nullptr || dladdr(sgemm, &info) == 0 || info.dli_fname == nullptr) return "";
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

bool IsReferenceBlas(std::string_view path) {
  return path.find("/blas/libblas.so") != std::string_view::npos;
}

bool IsThreadUnsafeBlas(std::string_view path) {
  return path.find("/openblas-serial/") != std::string_view::npos;
}

absl::Status ConfigureTorchForWorkers(uint32_t threads) {
  at::set_num_threads(1);
  // OpenBLAS's threaded builds would start their own threads per product; each worker
  // already runs one.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(1);
  }
  const std::string blas = BlasLibraryPath();
  if (threads > 1 && IsThreadUnsafeBlas(blas)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "torch's matrix products run on ", blas,
        ", which returns wrong products when several threads call it at once, and ", threads,
        " workers would train as threads of this process; install libopenblas0-pthread "
        "(run.sh does; it takes over libblas.so.3) or choose another libblas.so.3 with "
        "update-alternatives --config libblas.so.3-x86_64-linux-gnu"));
  }
  static std::once_flag warned;
  std::call_once(warned, [&blas] {
    if (!IsReferenceBlas(blas)) return;
    std::fprintf(stderr,
                 "warning: torch's matrix products run on the reference BLAS (%s): training "
                 "is about 3x slower than on OpenBLAS; install libopenblas0-pthread (run.sh "
                 "does)\n",
                 blas.c_str());
  });
  return absl::OkStatus();
}

}  // namespace ps::fashion_mnist
