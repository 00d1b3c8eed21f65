// Codec specs that every generic codec test runs, with the relative L2 error each may
// have on Gaussian data (|x - decode(encode(x))| / |x|). Add a line per new codec or
// per distinct composition; the fuzz corpus and ps-bench's default list use it too.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ps::codecs::testing {

struct ExampleSpec {
  std::string spec;
  double max_rel_l2_error;  // on N(0, 1) data of a few thousand values
};

inline void PrintTo(const ExampleSpec& e, std::ostream* os) { *os << e.spec; }

inline const std::vector<ExampleSpec>& ExampleSpecs() {
  static const std::vector<ExampleSpec> specs = {
      {"fp32", 0.0},
      {"fp16", 1e-3},
      {"bf16", 8e-3},
  };
  return specs;
}

}  // namespace ps::codecs::testing
