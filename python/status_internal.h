// absl::Status to Python exceptions, and the checks every binding makes on the arrays it
// is handed (docs/python.md, "Errors").
//
//   INVALID_ARGUMENT, OUT_OF_RANGE  -> ValueError
//   a shard's refusal               -> ps_server.Refused (an Error) with its `reason`
//                                      and, for a push, tensor, slice, round and shard
//   anything else                   -> ps_server.Error (a RuntimeError) whose `code` is
//                                      the status code's name ("UNAVAILABLE", ...)
//
// Thread safety: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <span>
#include <string_view>

#include "absl/status/status.h"

namespace ps::python {

// Registers ps_server.Error and ps_server.Refused in `m` (once, at import).
void RegisterErrors(pybind11::module_& m);

// Throws the exception for a failed status; returns on OK.
void ThrowIfError(const absl::Status& status);

// A buffer of float32 values in C order, checked: `what` names the argument in
// messages. Refuses another dtype, a non-contiguous view and a number of dimensions
// other than `ndim` (-1: any, the values taken in C order as one row). The view borrows
// the buffer's memory: keep `info` alive.
struct FloatArray {
  pybind11::buffer_info info;
  std::span<float> values;  // all of them, row after row
  size_t rows = 1, cols = 0;
};
FloatArray CheckedFloats(const pybind11::buffer& buffer, int ndim, const char* what,
                         bool writable = false);

}  // namespace ps::python
