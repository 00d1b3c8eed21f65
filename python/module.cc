// _ps_server: the compiled module under the ps_server package (docs/python.md). Import
// the package, not this module: ps_server.aggregators, ps_server.codecs.
#include <pybind11/pybind11.h>

#include "python/bindings_internal.h"
#include "python/status_internal.h"

PYBIND11_MODULE(_ps_server, m) {
  m.doc() = "ps-server's rules, codecs and worker library (use the ps_server package)";
  ps::python::RegisterErrors(m);
  ps::python::BindAggregators(m);
  ps::python::BindCodecs(m);
  ps::python::BindWorker(m);
}
