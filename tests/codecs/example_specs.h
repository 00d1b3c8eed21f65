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
      // Ternary at scale max|x| * s: on Gaussian data most values fall below M / 2 and
      // become 0; the error is below 1 for every s < 2 (docs/codecs.md).
      {"3lc", 0.96},
      {"3lc(s=1.5)", 1.0},
      {"3lc(s=1.9)", 1.0},
      // Without a matrix shape (matrix_cols = 0 here) powersgd sends raw fp32.
      {"powersgd", 0.0},
      {"powersgd(rank=1)", 0.0},
  };
  return specs;
}

}  // namespace ps::codecs::testing
