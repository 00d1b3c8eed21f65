#include "python/status_internal.h"

#include <optional>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "python/status_internal.h"
#include "worker_lib/worker.h"

namespace py = pybind11;

namespace ps::python {
namespace {

PyObject* error_type = nullptr;    // ps_server.Error, owned by the module
PyObject* refused_type = nullptr;  // ps_server.Refused (an Error)

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace

void RegisterErrors(py::module_& m) {
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  error.doc() =
      "A request the server or the library refused or could not complete; `code` names the "
      "status (UNAVAILABLE, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ...).";
  error_type = error.ptr();
  static py::exception<std::runtime_error> refused(m, "Refused", error.ptr());
  refused.doc() =
      "A shard refused a request. `reason` is the refusal's kind (late, duplicate, malformed, "
      "rate_limited, ...); for a push, `tensor`, `slice`, `round` and `shard` say which one "
      "(None otherwise). A push that failed without a refusal (UNAVAILABLE after the last "
      "attempt) is an Error whose `reason` is empty.";
  refused_type = refused.ptr();
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string message(status.message());
  const std::optional<core::Refusal> refusal = core::RefusalOf(status);
  const std::optional<PushFailure> push = PushFailureOf(status);
  // A bad argument of this process's own call; a shard's refusal or a failed push is
  // not (a malformed push is INVALID_ARGUMENT too, but the shard said so).
  const bool own_argument = status.code() == absl::StatusCode::kInvalidArgument ||
                            status.code() == absl::StatusCode::kOutOfRange;
  if (own_argument && !refusal.has_value() && !push.has_value()) throw py::value_error(message);
  PyObject* type = refusal.has_value() ? refused_type : error_type;
  py::object e = py::reinterpret_borrow<py::object>(type)(message);
  e.attr("code") = CodeName(status.code());
  e.attr("reason") = refusal.has_value() ? std::string(core::RefusalName(*refusal)) : "";
  py::object none = py::none();
  e.attr("tensor") = push.has_value() ? py::object(py::str(push->tensor)) : none;
  e.attr("slice") = push.has_value() ? py::object(py::int_(push->slice)) : none;
  e.attr("round") = push.has_value() ? py::object(py::int_(push->round)) : none;
  e.attr("shard") = push.has_value() ? py::object(py::int_(push->shard)) : none;
  PyErr_SetObject(type, e.ptr());
  throw py::error_already_set();
}

FloatArray CheckedFloats(const py::buffer& buffer, int ndim, const char* what, bool writable) {
  FloatArray a{buffer.request(writable)};
  const py::buffer_info& info = a.info;
  if (info.format != py::format_descriptor<float>::format() || info.itemsize != sizeof(float)) {
    throw py::type_error(absl::StrCat(what, " must hold float32 values, got format '", info.format,
                                      "' (", info.itemsize, "-byte items)"));
  }
  if (ndim >= 0 && info.ndim != ndim) {
    throw py::value_error(absl::StrCat(what, " must have ", ndim, " dimension",
                                       ndim == 1 ? "" : "s", ", got ", info.ndim));
  }
  // C order: the last dimension contiguous, each earlier one spanning the later ones.
  py::ssize_t expected = sizeof(float);
  for (int d = static_cast<int>(info.ndim) - 1; d >= 0; --d) {
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
    a.cols = static_cast<size_t>(info.size);  // any shape: its values in C order
  }
  a.values = std::span<float>(static_cast<float*>(info.ptr), a.rows * a.cols);
  return a;
}

}  // namespace ps::python
