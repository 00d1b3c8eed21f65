#include "examples/fashion_mnist/idx.h"

#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::fashion_mnist {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Header(uint32_t magic, std::vector<uint32_t> dims) {
  std::vector<uint8_t> out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return out;
}

std::vector<uint8_t> Concat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "idx_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteGz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    if (!bytes.empty()) {
      EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
    }
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }

  std::string WriteRaw(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // A consistent split of `count` 28 x 28 images with labels i % 10 and pixel i.
  void WriteSplit(Split split, uint32_t images, uint32_t labels) {
    std::vector<uint8_t> pixels(size_t{images} * 28 * 28);
    for (uint32_t i = 0; i < images; ++i) {
      std::fill_n(pixels.begin() + static_cast<ptrdiff_t>(size_t{i} * 784), 784,
                  static_cast<uint8_t>(i));
    }
    std::vector<uint8_t> label_bytes(labels);
    for (uint32_t i = 0; i < labels; ++i) label_bytes[i] = static_cast<uint8_t>(i % 10);
    WriteGz(ImagesFileName(split), Concat(Header(kIdxImagesMagic, {images, 28, 28}), pixels));
    WriteGz(LabelsFileName(split), Concat(Header(kIdxLabelsMagic, {labels}), label_bytes));
  }

  std::filesystem::path dir_;
};

TEST_F(IdxTest, ReadsValidImages) {
  const std::vector<uint8_t> pixels = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::string path = WriteGz("img.gz", Concat(Header(kIdxImagesMagic, {3, 2, 2}), pixels));
  auto images = ReadIdxImages(path);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->count, 3u);
  EXPECT_EQ(images->rows, 2u);
  EXPECT_EQ(images->cols, 2u);
  EXPECT_EQ(images->image_size(), 4u);
  EXPECT_EQ(images->pixels, pixels);
}

TEST_F(IdxTest, ReadsValidLabels) {
  const std::string path = WriteGz("lbl.gz", Concat(Header(kIdxLabelsMagic, {4}), {9, 0, 3, 7}));
  auto labels = ReadIdxLabels(path);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels, (std::vector<uint8_t>{9, 0, 3, 7}));
}

TEST_F(IdxTest, RejectsBadMagic) {
  // A labels file where images are expected, and a wrong type byte.
  const std::string labels = WriteGz("lbl.gz", Concat(Header(kIdxLabelsMagic, {1}), {3}));
  auto images = ReadIdxImages(labels);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(images.status().message(), HasSubstr("magic"));

  const std::string floats = WriteGz("f.gz", Concat(Header(0x00000d01, {1}), {0, 0, 0, 0}));
  EXPECT_EQ(ReadIdxLabels(floats).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxTest, RejectsTruncatedPayload) {
  // The header promises 3 images of 2 x 2; only two are there.
  const std::string path =
      WriteGz("img.gz", Concat(Header(kIdxImagesMagic, {3, 2, 2}), std::vector<uint8_t>(8, 1)));
  auto images = ReadIdxImages(path);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().message(), HasSubstr("truncated"));
}

TEST_F(IdxTest, RejectsTruncatedHeader) {
  std::vector<uint8_t> header = Header(kIdxImagesMagic, {3, 2, 2});
  header.resize(9);
  EXPECT_EQ(ReadIdxImages(WriteGz("img.gz", header)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadIdxLabels(WriteGz("empty.gz", {})).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(IdxTest, RejectsTrailingBytes) {
  const std::string path = WriteGz("lbl.gz", Concat(Header(kIdxLabelsMagic, {2}), {1, 2, 3}));
  auto labels = ReadIdxLabels(path);
  EXPECT_EQ(labels.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(labels.status().message(), HasSubstr("trailing"));
}

TEST_F(IdxTest, RejectsCountAboveCapBeforeAllocating) {
  // 2^32 - 1 images of 1024 x 1024 would be 4 PiB: refused from the header alone.
  const std::string huge = WriteGz("img.gz", Header(kIdxImagesMagic, {0xffffffffu, 1024, 1024}));
  auto images = ReadIdxImages(huge);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(images.status().message(), HasSubstr("cap"));

  const std::string three = WriteGz("lbl.gz", Concat(Header(kIdxLabelsMagic, {3}), {1, 2, 3}));
  EXPECT_TRUE(ReadIdxLabels(three, 3).ok());
  EXPECT_EQ(ReadIdxLabels(three, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxTest, RejectsZeroAndOversizedDimensions) {
  EXPECT_EQ(ReadIdxImages(WriteGz("a.gz", Header(kIdxImagesMagic, {0, 28, 28}))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadIdxImages(WriteGz("b.gz", Header(kIdxImagesMagic, {1, 0, 28}))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadIdxImages(WriteGz("c.gz", Header(kIdxImagesMagic, {1, 28, kMaxImageSide + 1})))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxTest, RejectsFileThatIsNotGzip) {
  // A perfectly good IDX file, but stored uncompressed.
  const std::string path = WriteRaw("plain", Concat(Header(kIdxLabelsMagic, {2}), {1, 2}));
  auto labels = ReadIdxLabels(path);
  EXPECT_EQ(labels.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(labels.status().message(), HasSubstr("not a gzip file"));
}

TEST_F(IdxTest, RejectsCutGzipStream) {
  std::vector<uint8_t> payload(5000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7919 % 251);
  const std::string whole = WriteGz("whole.gz", Concat(Header(kIdxLabelsMagic, {5000}), payload));
  ASSERT_TRUE(ReadIdxLabels(whole).ok());
  std::ifstream in(whole, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  bytes.resize(bytes.size() / 2);
  auto labels = ReadIdxLabels(WriteRaw("cut.gz", bytes));
  EXPECT_EQ(labels.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(IdxTest, RejectsCorruptGzipData) {
  const std::string whole = WriteGz("whole.gz", Concat(Header(kIdxLabelsMagic, {3}), {1, 2, 3}));
  std::ifstream in(whole, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  // Damage the CRC in the trailer (the last 8 bytes are CRC-32 and length).
  bytes[bytes.size() - 8] ^= 0xff;
  EXPECT_EQ(ReadIdxLabels(WriteRaw("bad.gz", bytes)).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(IdxTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadIdxImages((dir_ / "nope.gz").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(IdxTest, LoadsConsistentSplit) {
  WriteSplit(Split::kTest, 12, 12);
  auto data = LoadFashionMnist(dir_.string(), Split::kTest);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 12u);
  EXPECT_EQ(data->images.pixels[5 * 784 + 17], 5);
  EXPECT_EQ(data->labels[11], 1);
}

TEST_F(IdxTest, RejectsImageAndLabelCountMismatch) {
  WriteSplit(Split::kTrain, 12, 11);
  auto data = LoadFashionMnist(dir_.string(), Split::kTrain);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("11 labels"));
}

TEST_F(IdxTest, RejectsLabelOutOfRange) {
  WriteSplit(Split::kTest, 2, 2);
  WriteGz(LabelsFileName(Split::kTest), Concat(Header(kIdxLabelsMagic, {2}), {3, 10}));
  auto data = LoadFashionMnist(dir_.string(), Split::kTest);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("label 10"));
}

TEST_F(IdxTest, RejectsImagesThatAreNot28By28) {
  WriteGz(ImagesFileName(Split::kTest), Concat(Header(kIdxImagesMagic, {1, 2, 2}), {1, 2, 3, 4}));
  WriteGz(LabelsFileName(Split::kTest), Concat(Header(kIdxLabelsMagic, {1}), {1}));
  EXPECT_EQ(LoadFashionMnist(dir_.string(), Split::kTest).status().code(),
            absl::StatusCode::kInvalidArgument);
}

constexpr char kDebianDir[] = "/usr/share/datasets/fashion-mnist";

TEST(IdxRealDataTest, ReadsDebianFashionMnist) {
  if (!std::filesystem::exists(std::string(kDebianDir) + "/" + ImagesFileName(Split::kTrain))) {
    GTEST_SKIP() << "Fashion-MNIST not installed in " << kDebianDir
                 << " (apt-get install dataset-fashion-mnist)";
  }
  for (auto [split, count] : {std::pair{Split::kTrain, 60000u}, std::pair{Split::kTest, 10000u}}) {
    auto data = LoadFashionMnist(kDebianDir, split);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->size(), count);
    EXPECT_EQ(data->images.count, count);
    EXPECT_EQ(data->images.pixels.size(), size_t{count} * 784);
    // Fashion-MNIST is balanced: every class has a tenth of the examples.
    std::array<uint32_t, kNumClasses> histogram{};
    for (uint8_t label : data->labels) ++histogram[label];
    for (uint32_t n : histogram) EXPECT_EQ(n, count / 10);
  }
}

}  // namespace
}  // namespace ps::fashion_mnist
