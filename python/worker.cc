// ps_server.Worker's compiled half: ps::Worker (worker_lib/worker.h) for Python. Arrays
// cross without copies: a push's gradient is read where it lies (Push copies it into its
// encoding before returning), a pull writes straight into the caller's arrays. Every
// call that may block releases the GIL.
#include "worker_lib/worker.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/credentials.h"
#include "core/data_plane.h"
#include "core/layout.h"
#include "python/bindings_internal.h"
#include "python/status_internal.h"
#include "worker_lib/adacomm.h"

namespace py = pybind11;

namespace ps::python {
namespace {

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || seconds > 1e9) {
    throw py::value_error(absl::StrCat(what, " must be a number of seconds >= 0, got ", seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

// Arrays handed in per tensor (one per tensor of the layout, in its order), each of its
// tensor's size; the infos keep them borrowed.
struct OutArrays {
  std::vector<FloatArray> arrays;
  std::vector<std::span<float>> spans;
};

OutArrays CheckedArrays(const core::ModelLayout& layout, const py::sequence& arrays,
                        const char* what, bool writable) {
  const auto& tensors = layout.tensors();
  if (static_cast<size_t>(py::len(arrays)) != tensors.size()) {
    throw py::value_error(absl::StrCat(what, " holds ", py::len(arrays), " arrays; the layout has ",
                                       tensors.size(), " tensors"));
  }
  OutArrays o;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::string name = absl::StrCat(what, "[", t, "] ('", tensors[t].name, "')");
    o.arrays.push_back(CheckedFloats(arrays[t].cast<py::buffer>(), -1, name.c_str(), writable));
    if (o.arrays.back().values.size() != tensors[t].numel) {
      throw py::value_error(absl::StrCat(name, " holds ", o.arrays.back().values.size(),
                                         " values; the tensor has ", tensors[t].numel));
    }
    o.spans.push_back(o.arrays.back().values);
  }
  return o;
}

// A pull in progress. It keeps the arrays it writes into and the worker alive until it
// finished (its destructor waits, with the GIL released).
class PyPullTicket {
 public:
  PyPullTicket(std::unique_ptr<PullTicket> ticket, OutArrays outs, py::object worker,
               std::shared_ptr<Worker> held, std::shared_ptr<std::atomic<int>> live)
      : ticket_(std::move(ticket)),
        outs_(std::move(outs)),
        worker_(std::move(worker)),
        held_(std::move(held)),
        live_(std::move(live)) {
    ++*live_;
  }
  ~PyPullTicket() {
    {
      py::gil_scoped_release release;
      ticket_.reset();
      held_.reset();
    }
    --*live_;
  }

  void WaitTensor(size_t tensor) {
    absl::Status st;
    {
      py::gil_scoped_release release;
      st = ticket_->WaitTensor(tensor);
    }
    ThrowIfError(st);
  }
  bool Ready(size_t tensor) const { return ticket_->TensorReady(tensor); }
  uint64_t Wait() {
    absl::StatusOr<uint64_t> v;
    {
      py::gil_scoped_release release;
      v = ticket_->Wait();
    }
    ThrowIfError(v.status());
    return *v;
  }

 private:
  std::unique_ptr<PullTicket> ticket_;
  OutArrays outs_;
  py::object worker_;
  std::shared_ptr<Worker> held_;            // the worker the ticket pulls through
  std::shared_ptr<std::atomic<int>> live_;  // the worker's count of live tickets
};

class PyWorker {
 public:
  // `layout`: the tensors cut into slices of `slice_elems`, or of the default size when
  // that is Worker::Start's "the job's" (the sizes it checks do not depend on it).
  PyWorker(WorkerOptions options, core::ModelLayout layout, uint32_t slice_elems,
           const py::object& initial)
      : borrows_(options.push.borrow ||
                 std::any_of(options.tensor_push.begin(), options.tensor_push.end(),
                             [](const auto& entry) { return entry.second.borrow; })) {
    OutArrays in;  // borrowed until Start returned
    std::vector<std::span<const float>> spans;
    if (!initial.is_none()) {
      in = CheckedArrays(layout, initial.cast<py::sequence>(), "initial", false);
      for (std::span<float> v : in.spans) spans.emplace_back(v);
    }
    absl::StatusOr<std::unique_ptr<Worker>> started;
    {
      py::gil_scoped_release release;
      started = Worker::Start(std::move(options), layout.tensors(), slice_elems, spans);
    }
    ThrowIfError(started.status());
    worker_ = std::shared_ptr<Worker>(*std::move(started));
  }
  ~PyWorker() { Drop(); }

  // Ends the sessions and the worker's threads (pushes not yet waited for may be lost).
  // Refused while a pull ticket of this worker is alive: it writes into arrays through it.
  // A call another thread is in keeps the worker until it returns.
  void Close() {
    if (*live_tickets_ > 0) {
      throw py::value_error(absl::StrCat("cannot close: ", live_tickets_->load(),
                                         " pull ticket(s) still running; wait for them first"));
    }
    Drop();
  }

  // The worker, for a call made with the GIL held; ValueError once closed.
  std::shared_ptr<Worker> Acquire() const {
    if (worker_ == nullptr) throw py::value_error("this Worker was closed");
    return worker_;
  }
  Worker& worker() { return *Acquire(); }

  // fn(worker) with the GIL released. The call holds its own reference, so a close() in
  // another thread meanwhile cannot destroy the worker under it: the last holder does,
  // here, still without the GIL.
  template <typename Fn>
  auto Call(Fn fn) {
    std::shared_ptr<Worker> w = Acquire();
    py::gil_scoped_release release;
    auto result = fn(*w);
    w.reset();
    return result;
  }

  // `lr` (None: unchanged) is the learning rate this and the tensor's later pushes carry.
  void Push(size_t tensor, uint64_t round, const py::buffer& grad, std::optional<double> lr) {
    FloatArray g = CheckedFloats(grad, -1, "grad");
    const absl::Status st = Call([&](Worker& w) {
      if (lr.has_value()) {
        if (absl::Status st = w.SetLearningRate(tensor, *lr); !st.ok()) return st;
      }
      return w.Push(tensor, round, g.values);
    });
    // A borrowed push may read the array until WaitPushes returns: its buffer view keeps
    // the array (and a torch tensor under it) alive that long, whatever the caller drops.
    // Kept after a failed push too; the worker may still hold a slice it sent.
    if (borrows_) borrowed_.push_back(std::move(g));
    ThrowIfError(st);
  }

  void WaitPushes() {
    // Only what was pushed before this call is released: a push from another thread
    // meanwhile (the GIL is released while waiting) may still be in flight.
    const size_t before = borrowed_.size();
    const absl::Status st = Call([](Worker& w) { return w.WaitPushes(); });
    borrowed_.erase(borrowed_.begin(), borrowed_.begin() + static_cast<std::ptrdiff_t>(
                                                               std::min(before, borrowed_.size())));
    ThrowIfError(st);
  }

  uint64_t PutObject(const std::string& key, const py::bytes& value) {
    const std::string bytes = value;  // copied while the GIL is held
    const absl::StatusOr<uint64_t> v = Call([&](Worker& w) { return w.PutObject(key, bytes); });
    ThrowIfError(v.status());
    return *v;
  }

  py::tuple GetObject(uint32_t owner, const std::string& key, uint64_t min_version,
                      double timeout) {
    const std::chrono::milliseconds t = Millis(timeout, "timeout");
    absl::StatusOr<Worker::StoredObject> got =
        Call([&](Worker& w) { return w.GetObject(owner, key, min_version, t); });
    ThrowIfError(got.status());
    return py::make_tuple(got->version, py::bytes(got->value));
  }

  uint64_t Pull(size_t tensor, uint64_t min_version, const py::buffer& out, double timeout) {
    const FloatArray o = CheckedFloats(out, -1, "out", /*writable=*/true);
    const std::chrono::milliseconds t = Millis(timeout, "timeout");
    const absl::StatusOr<uint64_t> v =
        Call([&](Worker& w) { return w.Pull(tensor, min_version, o.values, t); });
    ThrowIfError(v.status());
    return *v;
  }

  uint64_t PullAll(uint64_t min_version, const py::sequence& outs, double timeout) {
    const OutArrays o = CheckedArrays(worker().layout(), outs, "outs", true);
    const std::chrono::milliseconds t = Millis(timeout, "timeout");
    const absl::StatusOr<uint64_t> v =
        Call([&](Worker& w) { return w.PullAll(min_version, o.spans, t); });
    ThrowIfError(v.status());
    return *v;
  }

  void Leave(double timeout) {
    const std::chrono::milliseconds t = Millis(timeout, "timeout");
    ThrowIfError(Call([&](Worker& w) { return w.Leave(t); }));
  }

  // Worker::Adopt; `values` (a sequence of arrays, one per tensor) on the root, None
  // elsewhere.
  void Adopt(uint64_t round, uint32_t root, const py::object& values, double timeout) {
    OutArrays in;  // borrowed until Adopt returned
    std::vector<std::span<const float>> spans;
    if (!values.is_none()) {
      in = CheckedArrays(worker().layout(), values.cast<py::sequence>(), "values", false);
      for (std::span<float> v : in.spans) spans.emplace_back(v);
    }
    const std::chrono::milliseconds t = Millis(timeout, "timeout");
    ThrowIfError(Call([&](Worker& w) { return w.Adopt(round, root, spans, t); }));
  }

  std::unique_ptr<PyPullTicket> StartPullAll(const py::object& self, uint64_t min_version,
                                             const py::sequence& outs, double timeout) {
    std::shared_ptr<Worker> held = Acquire();
    OutArrays o = CheckedArrays(held->layout(), outs, "outs", true);
    const std::chrono::milliseconds t = Millis(timeout, "timeout");
    absl::StatusOr<std::unique_ptr<PullTicket>> ticket;
    {
      py::gil_scoped_release release;
      ticket = held->StartPullAll(min_version, o.spans, t);
    }
    ThrowIfError(ticket.status());
    return std::make_unique<PyPullTicket>(*std::move(ticket), std::move(o), self, std::move(held),
                                          live_tickets_);
  }

  void ReportLoss(uint64_t round, double loss) { ThrowIfError(worker().ReportLoss(round, loss)); }

  // The losses the shards published with the highest version pulled (AdaComm), or None.
  py::object PublishedLossOrNone() {
    const std::optional<PublishedLoss> p = worker().published_loss();
    if (!p) return py::none();
    py::dict d;
    d["version"] = p->version;
    d["loss"] = p->loss;
    d["first_loss"] = p->first_loss;
    return d;
  }

  // AdaComm's period after the published losses (worker_lib/adacomm.h).
  uint32_t AdaCommPeriodOf(uint32_t tau0, uint32_t tau_max, double lr_ratio) {
    const AdaCommOptions o{.tau0 = tau0, .tau_min = 1, .tau_max = tau_max};
    ThrowIfError(ValidateAdaComm(o));
    return AdaCommPeriod(o, worker().published_loss(), lr_ratio);
  }

  py::dict Stats() {
    const WorkerStats s = worker().stats();
    py::dict d;
    d["slices_pushed"] = s.slices_pushed;
    d["slices_borrowed"] = s.slices_borrowed;
    d["slices_held_from_before"] = s.slices_held_from_before;
    d["slices_refused"] = s.slices_refused;
    d["push_bytes"] = s.push_bytes;
    d["slices_pulled"] = s.slices_pulled;
    d["pull_bytes"] = s.pull_bytes;
    d["slices_pulled_as_change"] = s.slices_pulled_as_change;
    d["retries"] = s.retries;
    d["pushes_replayed"] = s.pushes_replayed;
    d["udp_datagrams_sent"] = s.udp_datagrams_sent;
    d["udp_bytes"] = s.udp_bytes;
    d["udp_send_errors"] = s.udp_send_errors;
    d["tcp_rto_min_unset"] = s.tcp_rto_min_unset;
    d["plans"] = s.plan.plans;
    d["plan_codecs"] = s.plan.codecs;
    return d;
  }

  py::list Shards() {
    py::list out;
    for (const ShardInfo& i : worker().shards()) {
      py::dict d;
      d["shard_id"] = i.shard_id;
      d["num_workers"] = i.num_workers;
      d["aggregator"] = i.aggregator;
      d["aggregate_only"] = i.aggregate_only;
      d["learning_rate"] = i.learning_rate;
      d["momentum"] = i.momentum;
      d["weight_decay"] = i.weight_decay;
      d["version"] = i.version;
      d["adds_changes_as_they_are"] = i.AddsChangesAsTheyAre();
      d["data_plane"] = std::string(core::DataPlaneName(i.data_plane));
      out.append(d);
    }
    return out;
  }

 private:
  // Lets go of the worker (the last holder destroys it) without the GIL.
  void Drop() {
    const std::weak_ptr<Worker> gone = worker_;
    {
      std::shared_ptr<Worker> w = std::move(worker_);
      py::gil_scoped_release release;
      w.reset();
    }
    // Once the worker is gone nothing reads the borrowed arrays (released here, with the
    // GIL held). While another thread's call still holds it, they stay until the next
    // Drop (the destructor's at the latest, when no call can be in flight).
    if (gone.expired()) borrowed_.clear();
  }

  std::shared_ptr<Worker> worker_;
  // PushOptions::borrow for any tensor: pushes hold their arrays until WaitPushes.
  bool borrows_ = false;
  std::vector<FloatArray> borrowed_;
  std::shared_ptr<std::atomic<int>> live_tickets_ = std::make_shared<std::atomic<int>>(0);
};

core::ModelLayout MakeLayout(const py::sequence& tensors, uint32_t slice_elems,
                             uint32_t num_shards) {
  std::vector<core::TensorSpec> specs;
  for (const py::handle& item : tensors) {
    const py::tuple t = item.cast<py::tuple>();
    if (t.size() < 2 || t.size() > 5) {
      throw py::value_error(
          "each tensor is (name, numel[, priority[, row_elems[, optimizer]]]), got a tuple of " +
          std::to_string(t.size()));
    }
    core::TensorSpec s;
    s.name = t[0].cast<std::string>();
    s.numel = t[1].cast<uint64_t>();
    s.priority = t.size() > 2 ? t[2].cast<int32_t>() : static_cast<int32_t>(specs.size());
    s.row_elems = t.size() > 3 ? t[3].cast<uint32_t>() : 0;
    s.optimizer = t.size() > 4 ? t[4].cast<std::string>() : std::string();
    specs.push_back(std::move(s));
  }
  absl::StatusOr<core::ModelLayout> layout = core::ModelLayout::Create(
      std::move(specs), slice_elems == kJobSliceElems ? core::kDefaultSliceElems : slice_elems,
      num_shards);
  ThrowIfError(layout.status());
  return *std::move(layout);
}

// The `data_plane` argument: None follows the plane each shard's Join answer names,
// "grpc" or "tcp" asks for that one (a shard on the other refuses the Join).
std::optional<core::DataPlane> PlaneOption(const py::object& plane) {
  if (plane.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(plane)) {
    absl::StatusOr<core::DataPlane> parsed = core::ParseDataPlane(plane.cast<std::string>());
    if (parsed.ok()) return *parsed;
  }
  throw py::value_error(absl::StrCat("data_plane must be \"grpc\", \"tcp\" or None (whatever the "
                                     "shards run), got ", py::repr(plane).cast<std::string>()));
}

PushOptions MakePush(const std::string& codec, bool error_feedback, double momentum,
                     bool borrow) {
  PushOptions p;
  p.codec = codec;
  p.error_feedback = error_feedback;
  p.momentum = momentum;
  p.borrow = borrow;
  return p;
}

}  // namespace

void BindWorker(py::module_& m) {
  py::class_<PyPullTicket>(m, "PullTicket", "A pull in progress (Worker.start_pull_all).")
      .def("wait_tensor", &PyPullTicket::WaitTensor, py::arg("tensor"),
           "Blocks until tensor `tensor` is in its array; raises the pull's error.")
      .def("ready", &PyPullTicket::Ready, py::arg("tensor"))
      .def("wait", &PyPullTicket::Wait, "Waits for the whole pull; the lowest version received.");

  py::class_<PyWorker>(m, "Worker")
      .def(py::init([](const std::vector<std::string>& shards, uint32_t worker_id,
                       const py::sequence& tensors, uint32_t slice_elems, const py::object& initial,
                       const std::string& token, const std::string& token_file,
                       const std::string& tls_ca, const std::string& tls_cert,
                       const std::string& tls_key, const std::string& tls_server_name,
                       const std::string& codec, bool error_feedback, double momentum,
                       const std::map<std::string, std::string>& tensor_codecs, uint64_t codec_seed,
                       double rpc_timeout, double connect_timeout, int max_attempts, bool plan,
                       const std::vector<std::string>& candidates, const py::object& data_plane,
                       bool may_register, const std::string& run_id, bool borrow) {
             WorkerOptions o;
             o.data_plane = PlaneOption(data_plane);
             o.run_id = run_id;
             o.shard_addresses = shards;
             o.worker_id = worker_id;
             o.credentials.tls_ca = tls_ca;
             o.credentials.tls_cert = tls_cert;
             o.credentials.tls_key = tls_key;
             o.credentials.tls_server_name = tls_server_name;
             o.credentials.token = token;
             if (!token_file.empty()) {
               if (!token.empty()) throw py::value_error("pass token or token_file, not both");
               absl::StatusOr<std::string> read = core::ReadTokenFile(token_file);
               ThrowIfError(read.status());
               o.credentials.token = *read;
             }
             o.push = MakePush(codec, error_feedback, momentum, borrow);
             for (const auto& [name, spec] : tensor_codecs) {
               o.tensor_push[name] = MakePush(spec, error_feedback, momentum, borrow);
             }
             o.codec_seed = codec_seed;
             o.rpc_timeout = Millis(rpc_timeout, "rpc_timeout");
             o.connect_timeout = Millis(connect_timeout, "connect_timeout");
             o.max_attempts = max_attempts;
             o.may_register = may_register;
             o.plan.enabled = plan;
             if (!candidates.empty()) o.plan.candidates = candidates;
             core::ModelLayout layout =
                 MakeLayout(tensors, slice_elems, static_cast<uint32_t>(shards.size()));
             return std::make_unique<PyWorker>(std::move(o), std::move(layout), slice_elems,
                                               initial);
           }),
           py::arg("shards"), py::arg("worker_id"), py::arg("tensors"), py::kw_only(),
           py::arg("slice_elems") = kJobSliceElems, py::arg("initial") = py::none(),
           py::arg("token") = "", py::arg("token_file") = "", py::arg("tls_ca") = "",
           py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_server_name") = "",
           py::arg("codec") = "fp32", py::arg("error_feedback") = false, py::arg("momentum") = 0.0,
           py::arg("tensor_codecs") = std::map<std::string, std::string>{},
           py::arg("codec_seed") = 0, py::arg("rpc_timeout") = 30.0,
           py::arg("connect_timeout") = 60.0, py::arg("max_attempts") = 6, py::arg("plan") = false,
           py::arg("plan_candidates") = std::vector<std::string>{},
           py::arg("data_plane") = py::none(), py::arg("may_register") = true,
           py::arg("run_id") = "", py::arg("borrow") = false)
      .def("push", &PyWorker::Push, py::arg("tensor"), py::arg("round"), py::arg("grad"),
           py::arg("lr") = py::none())
      .def("wait_pushes", &PyWorker::WaitPushes)
      .def("put_object", &PyWorker::PutObject, py::arg("key"), py::arg("value"))
      .def("get_object", &PyWorker::GetObject, py::arg("owner"), py::arg("key"),
           py::arg("min_version") = 1, py::arg("timeout") = 60.0)
      .def("pull", &PyWorker::Pull, py::arg("tensor"), py::arg("min_version"), py::arg("out"),
           py::arg("timeout") = 60.0)
      .def("pull_all", &PyWorker::PullAll, py::arg("min_version"), py::arg("outs"),
           py::arg("timeout") = 60.0)
      .def(
          "start_pull_all",
          [](py::object self, uint64_t min_version, const py::sequence& outs, double timeout) {
            return self.cast<PyWorker&>().StartPullAll(self, min_version, outs, timeout);
          },
          py::arg("min_version"), py::arg("outs"), py::arg("timeout") = 60.0)
      .def("leave", &PyWorker::Leave, py::arg("timeout") = 5.0)
      .def("adopt", &PyWorker::Adopt, py::arg("round"), py::arg("root"),
           py::arg("values") = py::none(), py::arg("timeout") = 60.0)
      .def("report_loss", &PyWorker::ReportLoss, py::arg("round"), py::arg("loss"))
      .def_property_readonly("published_loss", &PyWorker::PublishedLossOrNone)
      .def("adacomm_period", &PyWorker::AdaCommPeriodOf, py::arg("tau0"), py::arg("tau_max"),
           py::arg("lr_ratio") = 1.0)
      .def("stats", &PyWorker::Stats)
      .def_property_readonly("shards", &PyWorker::Shards)
      .def_property_readonly("start_version",
                             [](PyWorker& w) { return w.worker().start_version(); })
      .def_property_readonly("slice_elems",
                             [](PyWorker& w) { return w.worker().layout().slice_elems(); })
      .def_property_readonly("tensor_names",
                             [](PyWorker& w) {
                               std::vector<std::string> names;
                               for (const auto& t : w.worker().layout().tensors()) {
                                 names.push_back(t.name);
                               }
                               return names;
                             })
      .def("close", &PyWorker::Close);
}

}  // namespace ps::python
