// The parts of the _ps_server module, each binding one library (docs/python.md).
#pragma once

#include <pybind11/pybind11.h>

namespace ps::python {

void BindAggregators(pybind11::module_& m);  // aggregators.cc
void BindCodecs(pybind11::module_& m);       // codecs.cc
void BindWorker(pybind11::module_& m);       // worker.cc

}  // namespace ps::python
