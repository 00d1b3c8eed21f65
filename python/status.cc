#include "python/status_internal.h"

#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"

namespace py = pybind11;

namespace ps::python {
namespace {

PyObject* error_type = nullptr;  // ps_server.Error, owned by the module

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace

void RegisterErrors(py::module_& m) {
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  error.doc() =
      "A request the server or the library refused or could not complete; `code` names the "
      "status (UNAVAILABLE, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ...).";
  error_type = error.ptr();
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw py::value_error(message);
    default:
      break;
  }
  py::object e = py::reinterpret_borrow<py::object>(error_type)(message);
  e.attr("code") = CodeName(status.code());
  PyErr_SetObject(error_type, e.ptr());
  throw py::error_already_set();
}

FloatArray CheckedFloats(const py::buffer& buffer, int ndim, const char* what, bool writable) {
  FloatArray a{buffer.request(writable)};
  const py::buffer_info& info = a.info;
  if (info.format != py::format_descriptor<float>::format() || info.itemsize != sizeof(float)) {
    throw py::type_error(absl::StrCat(what, " must hold float32 values, got format '", info.format,
                                      "' (", info.itemsize, "-byte items)"));
  }
  if (info.ndim != ndim) {
    throw py::value_error(absl::StrCat(what, " must have ", ndim, " dimension",
                                       ndim == 1 ? "" : "s", ", got ", info.ndim));
  }
  // C order: the last dimension contiguous, each earlier one spanning the later ones.
  py::ssize_t expected = sizeof(float);
  for (int d = ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw py::value_error(absl::StrCat(what,
                                         " must be contiguous (C order); make it so with "
                                         "numpy.ascontiguousarray or tensor.contiguous()"));
    }
    expected *= info.shape[d];
  }
  if (ndim == 2) {
    a.rows = static_cast<size_t>(info.shape[0]);
    a.cols = static_cast<size_t>(info.shape[1]);
  } else {
    a.cols = static_cast<size_t>(info.shape[0]);
  }
  a.values = std::span<float>(static_cast<float*>(info.ptr), a.rows * a.cols);
  return a;
}

}  // namespace ps::python
