#include "examples/fashion_mnist/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace ps::fashion_mnist {
namespace {

// Owns one gzFile opened for reading.
class GzReader {
 public:
  static absl::StatusOr<GzReader> Open(const std::string& path) {
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) {
      return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    }
    GzReader reader(path, file);
    // gzdirect() looks at the first bytes: 1 means zlib would pass them through as is.
    if (gzdirect(file) == 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a gzip file"));
    }
    return reader;
  }

  GzReader(GzReader&& other) noexcept
      : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}
  GzReader& operator=(GzReader&&) = delete;
  GzReader(const GzReader&) = delete;
  ~GzReader() {
    if (file_ != nullptr) gzclose_r(file_);
  }

  // Reads exactly `size` bytes; `what` names them in the error.
  absl::Status ReadExact(void* out, size_t size, absl::string_view what) {
    auto* bytes = static_cast<unsigned char*>(out);
    size_t done = 0;
    while (done < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
      const int got = gzread(file_, bytes + done, chunk);
      if (got < 0) return ZlibError(what);
      if (got == 0) {
        // A gzip stream cut short reports Z_BUF_ERROR; a clean end of file reports OK.
        int code = Z_OK;
        const char* message = gzerror(file_, &code);
        std::string detail = code != Z_OK ? absl::StrCat(" (", message, ")") : "";
        return absl::DataLossError(absl::StrFormat("%s: truncated: %s has %u of %u bytes%s", path_,
                                                   what, done, size, detail));
      }
      done += static_cast<size_t>(got);
    }
    return absl::OkStatus();
  }

  // OK when the stream ends here; an error when bytes are left over or it is corrupt.
  absl::Status ExpectEnd() {
    unsigned char extra = 0;
    const int got = gzread(file_, &extra, 1);
    if (got < 0) return ZlibError("end of data");
    if (got > 0) {
      return absl::DataLossError(absl::StrCat(path_, ": trailing bytes after the declared data"));
    }
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code != Z_OK) {
      return absl::DataLossError(absl::StrCat(path_, ": gzip stream: ", message));
    }
    return absl::OkStatus();
  }

 private:
  GzReader(std::string path, gzFile file) : path_(std::move(path)), file_(file) {}

  absl::Status ZlibError(absl::string_view what) {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    return absl::DataLossError(
        absl::StrCat(path_, ": gzip error reading ", what, ": ", message ? message : "unknown"));
  }

  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads the magic and the `dims` dimensions that follow it.
absl::StatusOr<std::vector<uint32_t>> ReadHeader(GzReader& reader, const std::string& path,
                                                 uint32_t magic, size_t dims) {
  std::array<unsigned char, 4> word{};
  PS_RETURN_IF_ERROR(reader.ReadExact(word.data(), word.size(), "the magic number"));
  const uint32_t got = BigEndian32(word.data());
  if (got != magic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad IDX magic 0x%08x, expected 0x%08x (unsigned bytes, %d dimensions)",
                        path, got, magic, dims));
  }
  std::vector<uint32_t> out(dims);
  for (size_t i = 0; i < dims; ++i) {
    PS_RETURN_IF_ERROR(reader.ReadExact(word.data(), word.size(), "the dimensions"));
    out[i] = BigEndian32(word.data());
  }
  return out;
}

absl::Status CheckCount(const std::string& path, uint32_t count, uint32_t max_examples) {
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": zero examples"));
  if (count > max_examples) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", count, " examples, more than the cap of ", max_examples));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path, uint32_t max_examples) {
  PS_ASSIGN_OR_RETURN(GzReader reader, GzReader::Open(path));
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> dims, ReadHeader(reader, path, kIdxImagesMagic, 3));
  IdxImages images;
  images.count = dims[0];
  images.rows = dims[1];
  images.cols = dims[2];
  PS_RETURN_IF_ERROR(CheckCount(path, images.count, max_examples));
  for (uint32_t side : {images.rows, images.cols}) {
    if (side == 0 || side > kMaxImageSide) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": image size ", images.rows, " x ",
                                                     images.cols, " outside 1..", kMaxImageSide));
    }
  }
  // Both factors are capped, so the product fits: 2^20 * 2^20 < 2^63.
  const size_t bytes = images.image_size() * images.count;
  images.pixels.resize(bytes);
  PS_RETURN_IF_ERROR(reader.ReadExact(images.pixels.data(), bytes, "the pixels"));
  PS_RETURN_IF_ERROR(reader.ExpectEnd());
  return images;
}

absl::StatusOr<std::vector<uint8_t>> ReadIdxLabels(const std::string& path, uint32_t max_examples) {
  PS_ASSIGN_OR_RETURN(GzReader reader, GzReader::Open(path));
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> dims, ReadHeader(reader, path, kIdxLabelsMagic, 1));
  PS_RETURN_IF_ERROR(CheckCount(path, dims[0], max_examples));
  std::vector<uint8_t> labels(dims[0]);
  PS_RETURN_IF_ERROR(reader.ReadExact(labels.data(), labels.size(), "the labels"));
  PS_RETURN_IF_ERROR(reader.ExpectEnd());
  return labels;
}

std::string ImagesFileName(Split split) {
  return split == Split::kTrain ? "train-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte.gz";
}

std::string LabelsFileName(Split split) {
  return split == Split::kTrain ? "train-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte.gz";
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split,
                                         uint32_t max_examples) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  const std::string images_path = base + ImagesFileName(split);
  const std::string labels_path = base + LabelsFileName(split);
  Dataset data;
  PS_ASSIGN_OR_RETURN(data.images, ReadIdxImages(images_path, max_examples));
  PS_ASSIGN_OR_RETURN(data.labels, ReadIdxLabels(labels_path, max_examples));
  if (data.images.rows != 28 || data.images.cols != 28) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": images are ", data.images.rows,
                                                   " x ", data.images.cols, ", expected 28 x 28"));
  }
  if (data.labels.size() != data.images.count) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " has ", data.images.count,
                                                   " images but ", labels_path, " has ",
                                                   data.labels.size(), " labels"));
  }
  for (size_t i = 0; i < data.labels.size(); ++i) {
    if (data.labels[i] >= kNumClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{data.labels[i]},
                                                     " at index ", i, " is not below ",
                                                     kNumClasses));
    }
  }
  return data;
}

}  // namespace ps::fashion_mnist
