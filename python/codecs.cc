// ps_server.codecs' compiled half: the C++ codecs (codecs/codec.h) on float32 arrays,
// writing and reading the bytes a push carries, the GIL released while they run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "python/bindings_internal.h"
#include "python/status_internal.h"

namespace py = pybind11;

namespace ps::python {
namespace {

// A codec as Python holds it. Encode may keep state (PowerSGD's warm start), so encodes
// of one instance take turns; decodes run concurrently.
class PyCodec {
 public:
  PyCodec(const std::string& spec, uint64_t seed) {
    codecs::CodecOptions options;
    options.seed = seed;
    absl::StatusOr<std::unique_ptr<codecs::Codec>> made = codecs::MakeCodec(spec, options);
    ThrowIfError(made.status());
    codec_ = *std::move(made);
  }

  std::string spec() const { return std::string(codec_->spec()); }

  py::bytes Encode(const py::buffer& values, uint64_t round, uint32_t slice, uint32_t worker,
                   uint32_t matrix_cols) {
    FloatArray in = CheckedFloats(values, 1, "values");
    codecs::EncodeContext ctx;
    ctx.round = round;
    ctx.slice_id = slice;
    ctx.worker_id = worker;
    ctx.matrix_cols = matrix_cols;
    std::string payload;
    absl::Status status;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(encode_mu_);
      status = codec_->Encode(in.values, ctx, &payload);
    }
    ThrowIfError(status);
    return py::bytes(payload);
  }

  // Decodes into `out` (numel float32 values, writable, C order).
  void DecodeInto(const py::bytes& payload, const py::buffer& out) const {
    FloatArray o = CheckedFloats(out, 1, "out", /*writable=*/true);
    const std::string_view bytes = payload;  // the bytes object stays referenced by the caller
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = codec_->Decode(bytes, o.values);
    }
    ThrowIfError(status);
  }

  py::array_t<float> Decode(const py::bytes& payload, py::ssize_t numel) const {
    if (numel < 0) throw py::value_error(absl::StrCat("numel must be >= 0, got ", numel));
    py::array_t<float> out(numel);
    DecodeInto(payload, out);
    return out;
  }

  size_t MaxEncodedBytes(size_t numel) const { return codec_->MaxEncodedBytes(numel); }

 private:
  std::unique_ptr<codecs::Codec> codec_;
  std::mutex encode_mu_;
};

}  // namespace

void BindCodecs(py::module_& m) {
  py::class_<PyCodec>(m, "Codec", R"doc(A gradient codec, as ps-server's workers and shards run it.

Codec(spec, *, seed=0): spec in the server's grammar ("fp16", "topk(0.01)+varint+fp16",
"qsgd(s=16)"); seed mixes into stochastic rounding and per-worker random-k as the
worker library's codec_seed does. Refuses an unknown or malformed spec with ValueError.)doc")
      .def(py::init<const std::string&, uint64_t>(), py::arg("spec"), py::kw_only(),
           py::arg("seed") = 0)
      .def_property_readonly("spec", &PyCodec::spec, "The canonical spec, every argument written.")
      .def("encode", &PyCodec::Encode, py::arg("values"), py::kw_only(), py::arg("round") = 0,
           py::arg("slice") = 0, py::arg("worker") = 0, py::arg("matrix_cols") = 0,
           R"doc(The payload (bytes) of a push of `values` (1-D float32, C order) for this
round, slice and worker: the bytes the worker library sends.)doc")
      .def("decode", &PyCodec::Decode, py::arg("payload"), py::arg("numel"),
           "The numel float32 values a payload carries; refuses a malformed or hostile payload "
           "with ValueError (as a shard refuses the push).")
      .def("decode_into", &PyCodec::DecodeInto, py::arg("payload"), py::arg("out"),
           "decode() into an existing writable 1-D float32 array.")
      .def("max_encoded_bytes", &PyCodec::MaxEncodedBytes, py::arg("numel"));
  m.def("codec_names", &codecs::CodecNames, "The codec names a spec may start with.");
  m.def("stage_names", &codecs::StageNames, "Every stage name a spec may contain.");
}

}  // namespace ps::python
