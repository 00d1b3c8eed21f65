// Codec specs that every generic codec test runs, with the relative L2 error each may
// have on Gaussian data (|x - decode(encode(x))| / |x|). Add a line per new codec or
// per distinct composition; the fuzz corpus and ps-bench's default list use it too.
#pragma once

#include <cctype>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace ps::codecs::testing {

struct ExampleSpec {
  std::string spec;
  double max_rel_l2_error;  // on N(0, 1) data of a few thousand values
};

inline void PrintTo(const ExampleSpec& e, std::ostream* os) { *os << e.spec; }

// A test name for a spec: its letters and digits, '_' for the rest.
inline std::string SpecName(std::string_view spec) {
  std::string name;
  for (char c : spec) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

// The name of a (spec, slice size) parameter: SpecName, then "_n" and the size.
template <typename Info>
std::string ExampleName(const Info& info) {
  return SpecName(std::get<0>(info.param).spec) + "_n" + std::to_string(std::get<1>(info.param));
}

inline const std::vector<ExampleSpec>& ExampleSpecs() {
  static const std::vector<ExampleSpec> specs = {
      {"fp32", 0.0},
      {"fp16", 1e-3},
      {"bf16", 8e-3},
      {"sign", 0.8},  // sqrt(1 - 2 / pi) = 0.603 on large Gaussian data, more on few values
      // Sparse: every sparsifier, index stage and value stage at least once. Top-k's
      // error on N(0, 1) is sqrt(1 - kept energy), 0.47 at ratio 0.3; random-k and
      // threshold can drop (nearly) everything on a tiny slice.
      {"topk(0.3)", 0.48},
      {"topk(0.01)+bloom(p0, fpr=0.01)+fp16", 0.96},
      {"topk(0.3, method=sampled)+varint+fp16", 0.48},
      {"threshold(0.5)+varint+raw", 0.18},
      {"threshold(1)+bitmap+deflate", 1.0},
      {"randk(0.3, seed=7)+fp16", 1.0},
      {"randk(0.3)+deflate(level=1)", 0.85},
      {"topk(0.3)+rle+polyfit", 0.48},
      {"topk(0.3)+bloom(p0)+raw", 0.48},
      {"topk(0.3)+bloom(p1, fpr=0.05)+fp16", 0.57},
      {"topk(0.3)+bloom(p2)+polyfit(degree=3)", 0.49},
      {"randk(0.5, seed=3)+polyfit", 1.0},
      // Ternary at scale max|x| * s: on Gaussian data most values fall below M / 2 and
      // become 0; the error is below 1 for every s < 2 (docs/codecs.md).
      {"3lc", 0.96},
      {"3lc(s=1.5)", 1.0},
      {"3lc(s=1.9)", 1.0},
      // Without a matrix shape (matrix_cols = 0 here) powersgd sends raw fp32.
      {"powersgd", 0.0},
      {"powersgd(rank=1)", 0.0},
      // Stochastic rounding: unbiased, with variance set by the bucket's scale. int8's
      // step is max|x| / 127 (about 0.01 relative on N(0, 1)); terngrad's relative
      // variance is E|x| max|x| / E x^2 - 1 (about 1.5 at 512 values per bucket);
      // qsgd's is at most min(d / s^2, sqrt(d) / s) for buckets of d (QSGD, Lemma 3.1).
      {"int8", 0.02},
      {"int8(bucket=7)", 0.02},
      {"terngrad", 1.6},
      {"terngrad(bucket=7)", 1.0},
      {"qsgd", 0.8},
      {"qsgd(s=1, bucket=64)", 3.0},
      {"qsgd(s=65536, bucket=100)", 1e-4},
      // CAT picks its level between min and ratio (1 % of a tiny slice keeps ~nothing).
      {"topk(0.3, level=cat, min=0.01)+varint+fp16", 1.0},
      // CAT picks 3lc's s in [1, 1.9]: at most s = 1.9's error.
      {"3lc(s=1.9, level=cat)", 1.0},
      // CAT picks qsgd's s in {1, 2, 4, 8, 16}: at most s = 1's error in buckets of 64.
      {"qsgd(s=16, bucket=64, level=cat)", 3.0},
  };
  return specs;
}

}  // namespace ps::codecs::testing
