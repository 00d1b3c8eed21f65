// ps_server.aggregators' compiled half: the C++ rules (aggregators/aggregator.h) on
// float32 arrays, without copies, the GIL released while a rule runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "core/fp32_bytes.h"
#include "core/thread_pool.h"
#include "python/bindings_internal.h"
#include "python/status_internal.h"

namespace py = pybind11;

namespace ps::python {
namespace {

// One rule as Python holds it: the aggregator, its state between calls (centered
// clipping's centre) and the threads it may use.
class PyAggregator {
 public:
  PyAggregator(const std::string& spec, int n, int f, size_t threads,
               const aggregators::AggregatorOptions& defaults) {
    aggregators::AggregatorOptions options = defaults;
    options.num_workers = n;
    options.num_byzantine = f;
    absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> made =
        aggregators::MakeAggregator(spec, options);
    ThrowIfError(made.status());
    aggregator_ = *std::move(made);
    if (threads == 0) throw py::value_error("threads must be at least 1");
    if (threads > 1) pool_ = std::make_unique<core::ThreadPool>(threads - 1);
  }

  const aggregators::Aggregator& rule() const { return *aggregator_; }

  // vectors: k x d; returns the aggregate of d values.
  py::array_t<float> Aggregate(const py::buffer& vectors, uint64_t round) {
    FloatArray in = CheckedFloats(vectors, 2, "vectors");
    if (in.rows == 0 || in.cols == 0) {
      throw py::value_error(
          absl::StrCat("vectors must be k x d with k, d >= 1, got ", in.rows, " x ", in.cols));
    }
    py::array_t<float> out(static_cast<py::ssize_t>(in.cols));
    std::vector<const float*> rows(in.rows);
    for (size_t r = 0; r < in.rows; ++r) rows[r] = in.values.data() + r * in.cols;
    const std::span<float> out_values(out.mutable_data(), in.cols);
    absl::Status status;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      status = RunLocked(rows, out_values, round);
    }
    ThrowIfError(status);
    return out;
  }

  // The rule's memory between calls (StateRows() x d; empty until the first call).
  py::array_t<float> state() const {
    std::lock_guard<std::mutex> lock(mu_);
    py::array_t<float> a(static_cast<py::ssize_t>(state_.size()));
    std::copy(state_.begin(), state_.end(), a.mutable_data());
    return a;
  }

 private:
  absl::Status RunLocked(std::span<const float* const> rows, std::span<float> out, uint64_t round) {
    const size_t state_rows = aggregator_->StateRows();
    if (state_rows > 0) {
      if (state_.empty()) state_.assign(state_rows * out.size(), 0.0f);
      if (state_.size() != state_rows * out.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            std::string(aggregator_->name()), " keeps state for d = ", state_.size() / state_rows,
            " coordinates, got d = ", out.size(), "; use one Aggregator per tensor"));
      }
    }
    // The rules take finite inputs (a shard's decoders refuse the rest): say which is not.
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::span<const float> row(rows[r], out.size());
      if (const ptrdiff_t c = core::FindNonFinite(row); c >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("vectors[", r, ", ", c, "] is not finite (",
                                                       row[static_cast<size_t>(c)], ")"));
      }
    }
    aggregators::AggregationContext ctx;
    ctx.round = round;
    ctx.pool = pool_.get();
    ctx.state = state_;
    return aggregator_->Aggregate(rows, out, ctx);
  }

  std::unique_ptr<aggregators::Aggregator> aggregator_;
  std::unique_ptr<core::ThreadPool> pool_;
  mutable std::mutex mu_;
  std::vector<float> state_;
};

aggregators::AggregatorOptions OptionsFrom(int multi_krum_m, const std::string& krum_neighbours,
                                           const std::string& even_median, double weiszfeld_nu,
                                           int weiszfeld_iterations, double weiszfeld_tolerance,
                                           double clipping_tau, int clipping_iterations,
                                           uint64_t mda_max_subsets, uint64_t seed) {
  aggregators::AggregatorOptions o;
  o.multi_krum_m = multi_krum_m;
  absl::StatusOr<aggregators::KrumNeighbours> k = aggregators::ParseKrumNeighbours(krum_neighbours);
  ThrowIfError(k.status());
  o.krum_neighbours = *k;
  absl::StatusOr<aggregators::EvenMedian> m = aggregators::ParseEvenMedian(even_median);
  ThrowIfError(m.status());
  o.even_median = *m;
  o.weiszfeld_nu = weiszfeld_nu;
  o.weiszfeld_iterations = weiszfeld_iterations;
  o.weiszfeld_tolerance = weiszfeld_tolerance;
  o.clipping_tau = clipping_tau;
  o.clipping_iterations = clipping_iterations;
  o.mda_max_subsets = mda_max_subsets;
  o.seed = seed;
  return o;
}

}  // namespace

void BindAggregators(py::module_& m) {
  const aggregators::AggregatorOptions d;
  py::class_<PyAggregator>(m, "Aggregator", R"doc(A robust aggregation rule, as ps-server runs it.

Aggregator(spec, n, f, *, threads=1, multi_krum_m=0, krum_neighbours="paper",
           even_median="midpoint", weiszfeld_nu=0.1, weiszfeld_iterations=100,
           weiszfeld_tolerance=1e-6, clipping_tau=100.0, clipping_iterations=1,
           mda_max_subsets=1000000, seed=0)

spec: pre-aggregators joined by '+' in front of one rule ("nnm+trimmed_mean").
n: the number of workers; f: how many may be Byzantine. Refuses an unknown spec and n
below the rule's bound with ValueError.)doc")
      .def(py::init([](const std::string& spec, int n, int f, size_t threads, int multi_krum_m,
                       const std::string& krum_neighbours, const std::string& even_median,
                       double weiszfeld_nu, int weiszfeld_iterations, double weiszfeld_tolerance,
                       double clipping_tau, int clipping_iterations, uint64_t mda_max_subsets,
                       uint64_t seed) {
             return std::make_unique<PyAggregator>(
                 spec, n, f, threads,
                 OptionsFrom(multi_krum_m, krum_neighbours, even_median, weiszfeld_nu,
                             weiszfeld_iterations, weiszfeld_tolerance, clipping_tau,
                             clipping_iterations, mda_max_subsets, seed));
           }),
           py::arg("spec"), py::arg("n"), py::arg("f") = 0, py::kw_only(), py::arg("threads") = 1,
           py::arg("multi_krum_m") = d.multi_krum_m,
           py::arg("krum_neighbours") =
               std::string(aggregators::KrumNeighboursName(d.krum_neighbours)),
           py::arg("even_median") = std::string(aggregators::EvenMedianName(d.even_median)),
           py::arg("weiszfeld_nu") = d.weiszfeld_nu,
           py::arg("weiszfeld_iterations") = d.weiszfeld_iterations,
           py::arg("weiszfeld_tolerance") = d.weiszfeld_tolerance,
           py::arg("clipping_tau") = d.clipping_tau,
           py::arg("clipping_iterations") = d.clipping_iterations,
           py::arg("mda_max_subsets") = d.mda_max_subsets, py::arg("seed") = d.seed)
      .def("aggregate", &PyAggregator::Aggregate, py::arg("vectors"), py::arg("round") = 0,
           R"doc(Combines the rows of `vectors` (k x d float32, C order) into one vector of d
values (a new float32 array). `round` seeds the rules that shuffle (bucketing).)doc")
      .def_property_readonly("name",
                             [](const PyAggregator& a) { return std::string(a.rule().name()); })
      .def_property_readonly("min_inputs",
                             [](const PyAggregator& a) { return a.rule().MinInputs(); })
      .def_property_readonly("bound",
                             [](const PyAggregator& a) { return std::string(a.rule().Bound()); })
      .def_property_readonly("needs_gram",
                             [](const PyAggregator& a) { return a.rule().NeedsGram(); })
      .def_property_readonly("state", &PyAggregator::state);
  m.def("aggregator_names", &aggregators::AggregatorNames,
        "Rule names (the last stage of a spec).");
  m.def("preaggregator_names", &aggregators::PreAggregatorNames,
        "Pre-aggregator names (the stages before the rule).");
}

}  // namespace ps::python
