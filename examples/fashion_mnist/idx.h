// IDX files (the MNIST / Fashion-MNIST container) read from gzip, as Debian's
// dataset-fashion-mnist installs them in /usr/share/datasets/fashion-mnist/.
//
// An IDX file is a big-endian header -- two zero bytes, a type byte (0x08: unsigned
// byte), the number of dimensions -- then one uint32 per dimension and the data. The
// reader checks the gzip framing, magic, dimensions, a cap on the example count and the
// exact data length (truncated or trailing bytes are errors) before it trusts a size, and
// never allocates more than the capped size. Errors are absl::Status values naming the
// file; nothing here throws.
//
// Free functions, no shared state: safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::fashion_mnist {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // ubyte, 3 dimensions
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // ubyte, 1 dimension
// Default cap on the example count (Fashion-MNIST has 60000 + 10000).
inline constexpr uint32_t kDefaultMaxExamples = 1u << 20;
// Cap on one image side; 28 for (Fashion-)MNIST.
inline constexpr uint32_t kMaxImageSide = 1024;
// Classes of Fashion-MNIST; labels must be below this.
inline constexpr int kNumClasses = 10;

// Images as stored: row-major, one byte per pixel, image after image.
struct IdxImages {
  uint32_t count = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols

  size_t image_size() const { return static_cast<size_t>(rows) * cols; }
};

// Reads an images file (magic 0x00000803). More than `max_examples` images, a zero or
// oversized dimension, a short or long payload, or a file that is not gzip is an error.
absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path,
                                        uint32_t max_examples = kDefaultMaxExamples);

// Reads a labels file (magic 0x00000801) with the same checks.
absl::StatusOr<std::vector<uint8_t>> ReadIdxLabels(const std::string& path,
                                                   uint32_t max_examples = kDefaultMaxExamples);

// One split of Fashion-MNIST: images with their labels.
struct Dataset {
  IdxImages images;
  std::vector<uint8_t> labels;

  size_t size() const { return labels.size(); }
};

enum class Split { kTrain, kTest };

// Reads `dir`/train-{images-idx3,labels-idx1}-ubyte.gz (or t10k-... for kTest) and checks
// that the counts agree, images are 28 x 28 and every label is below kNumClasses.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split,
                                         uint32_t max_examples = kDefaultMaxExamples);

// The two file names of a split, relative to the data directory.
std::string ImagesFileName(Split split);
std::string LabelsFileName(Split split);

}  // namespace ps::fashion_mnist
