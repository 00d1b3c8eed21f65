// The GPU encoders checked on the CPU (docs/gpu.md, "Encoding on the device"): each
// kernel pipeline of codecs/cuda is replayed here step by step with the same PS_HD
// functions of codecs/hd_internal.h, in the kernels' decomposition (per value, per word,
// per group, per tile, scans), and must give the CPU codec's exact bytes; and
// CodecOptions::device = kCuda gives the CPU codec's bytes with a note where no device
// encodes. Runs without a GPU; cuda_device_encoder_test.cc runs the kernels themselves.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/device_encoder.h"
#include "codecs/hd_internal.h"
#include "codecs/kernels_internal.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "core/device.h"
#include "gmock/gmock.h"
#include "gpu/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::EncodeOk;
using ::ps::codecs::testing::ExpectSameSignPayload;
using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::Hex;
using ::ps::codecs::testing::MakeOk;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Sizes around every block, word, group, bucket and tile boundary the kernels have.
const std::vector<size_t> kSizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 31, 32, 33, 69, 70, 71,
                                    511, 512, 513, 1000, 4095, 4096, 4097, 8193, 70001};

// Gaussian values with some exact zeros, repeated magnitudes and sign flips, so ties,
// zero groups and -0 occur.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> v = Gaussian(n, seed);
  std::mt19937 rng(seed + 1000);
  for (size_t i = 0; i < n; ++i) {
    switch (rng() % 8) {
      case 0: v[i] = 0.0f; break;
      case 1: v[i] = -0.0f; break;
      case 2: v[i] = std::round(v[i] * 4) / 4; break;  // ties in magnitude
      default: break;
    }
  }
  return v;
}

// Mostly small values, so 3lc writes long zero runs.
std::vector<float> Sparse(size_t n, uint32_t seed) {
  std::vector<float> v(n, 0.0f);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 53 == 0) v[i] = (rng() % 2 ? 1.0f : -1.0f) * static_cast<float>(1 + rng() % 7);
    else if (rng() % 3 == 0) v[i] = 0.01f * static_cast<float>(rng() % 10);
  }
  return v;
}

std::string Header(PayloadFormat format, size_t n) {
  std::string out;
  internal::PutU8(&out, FormatByte(format));
  internal::PutVarint(&out, n);
  return out;
}

// ---- per-value functions ----

TEST(HdFunctionsTest, FloatToHalfMatchesTheFp16CodecOnEveryKindOfValue) {
  std::vector<float> v = Values(70001, 1);
  for (float& x : v) x = std::ldexp(x, static_cast<int>(std::lround(x * 7) % 30));  // spread exponents
  for (float x : {65504.0f, 65519.0f, 65520.0f, 1e30f, -1e30f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                  FLT_MIN, FLT_TRUE_MIN, -FLT_MAX, 6.1e-5f, 3.0e-5f}) {
    v.push_back(x);
  }
  auto codec = MakeOk("fp16");
  const std::string bytes = EncodeOk(*codec, v);
  std::string expected = Header(PayloadFormat::kFp16, 0).substr(0, 1);
  for (float x : v) {
    const uint16_t h = internal::FloatToHalf(x);
    expected += static_cast<char>(h & 0xff);
    expected += static_cast<char>(h >> 8);
  }
  EXPECT_EQ(bytes, expected);
}

TEST(HdFunctionsTest, FloatToBf16MatchesTheBf16Codec) {
  std::vector<float> v = Values(4097, 2);
  v.push_back(FLT_MAX);
  v.push_back(-0x1.fefffep127f);
  auto codec = MakeOk("bf16");
  std::string expected(1, static_cast<char>(FormatByte(PayloadFormat::kBf16)));
  for (float x : v) {
    const uint16_t h = internal::FloatToBf16(x);
    expected += static_cast<char>(h & 0xff);
    expected += static_cast<char>(h >> 8);
  }
  EXPECT_EQ(EncodeOk(*codec, v), expected);
}

TEST(HdFunctionsTest, PackCodes4PutsCodeJInBits2J) {
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t word = (c & 3) | ((c >> 2) & 3) << 8 | ((c >> 4) & 3) << 16 | (c >> 6) << 24;
    EXPECT_EQ(internal::PackCodes4(word), c);
  }
}

TEST(HdFunctionsTest, Pack3lcDigitsIsTheBase3Value) {
  for (int b = 0; b < 243; ++b) {
    uint64_t word = 0xabcdef0000000000ull;  // bytes above the five digits are ignored
    for (int j = 0, p = 1; j < 5; ++j, p *= 3) word |= uint64_t(b / p % 3) << (8 * j);
    EXPECT_EQ(internal::Pack3lcDigits(word), b);
  }
}

TEST(HdFunctionsTest, ZeroRunTokensAreGreedy) {
  for (uint64_t r = 0; r < 100; ++r) {
    std::vector<unsigned char> w(internal::ZeroRunTokenCount(r) + 1, 0xee);
    internal::WriteZeroRun(r, w.data());
    uint64_t covered = 0;
    for (size_t t = 0; t + 1 < w.size(); ++t) {
      covered += w[t] == internal::k3lcZeroGroup ? 1 : w[t] - internal::k3lcRunBase + internal::k3lcMinRun;
      if (t + 2 < w.size()) {
        EXPECT_EQ(w[t], 255) << r;  // full runs first
      }
    }
    EXPECT_EQ(covered, r);
    EXPECT_EQ(w.back(), 0xee) << "wrote past its count for " << r;
  }
}

TEST(HdFunctionsTest, SelectBinFindsTheKthLargestBin) {
  const uint32_t hist[6] = {5, 0, 3, 1, 0, 2};  // 11 keys, bins 0..5
  const struct { uint64_t k; uint32_t bin; uint64_t above; } cases[] = {
      {1, 5, 0}, {2, 5, 0}, {3, 3, 2}, {4, 2, 3}, {6, 2, 3}, {7, 0, 6}, {11, 0, 6}};
  for (const auto& c : cases) {
    uint64_t above = 0;
    EXPECT_EQ(internal::SelectBin(hist, 6, c.k, &above), c.bin) << c.k;
    EXPECT_EQ(above, c.above) << c.k;
  }
}

TEST(HdFunctionsTest, TopkSlotKeepsTheFirstNeededTies) {
  EXPECT_EQ(internal::TopkSlot(true, false, 3, 7, 2), 5);
  EXPECT_EQ(internal::TopkSlot(false, true, 3, 1, 2), 4);
  EXPECT_EQ(internal::TopkSlot(false, true, 3, 2, 2), -1);
  EXPECT_EQ(internal::TopkSlot(false, false, 3, 0, 2), -1);
}

// ---- the kernel pipelines, replayed ----

// sign: the ballot words of NegativeBit, scale from the double sum (its order is the
// CPU's here; the device's differs, see cuda_device_encoder_test.cc).
TEST(DevicePipelineTest, SignWordsMatchTheCpuBits) {
  for (size_t n : kSizes) {
    const std::vector<float> v = Values(n, static_cast<uint32_t>(n));
    auto codec = MakeOk("sign");
    const std::string bytes = EncodeOk(*codec, v);
    std::vector<uint32_t> words((n + 31) / 32, 0);
    for (size_t i = 0; i < n; ++i) words[i / 32] |= internal::NegativeBit(v[i]) << (i % 32);
    std::string bits(reinterpret_cast<const char*>(words.data()), (n + 7) / 8);
    ASSERT_EQ(bytes.substr(bytes.size() - bits.size()), bits) << n;
  }
}

// terngrad: bucket maxima of AbsBits, then a thread per output byte.
std::string TernGradPipeline(const std::vector<float>& v, size_t bucket, uint32_t seed) {
  const size_t n = v.size();
  const size_t buckets = (n + bucket - 1) / bucket;
  std::vector<uint32_t> max(buckets, 0);
  for (size_t i = 0; i < n; ++i) max[i / bucket] = std::max(max[i / bucket], internal::AbsBits(v[i]));
  std::string out = Header(PayloadFormat::kTernGrad, n);
  for (size_t b = 0; b < buckets; ++b) {
    const float s = internal::FloatFromBits(max[b]);
    internal::PutF32(&out, s < FLT_MIN ? 0.0f : s);
  }
  for (size_t j = 0; j < (n + 3) / 4; ++j) {
    uint32_t four = 0;
    for (size_t l = 0; l < 4 && 4 * j + l < n; ++l) {
      const size_t i = 4 * j + l;
      const float s = internal::FloatFromBits(max[i / bucket]);
      const uint8_t code = s < FLT_MIN ? 0 : internal::TernaryCode(v[i], 1.0f / s, seed, static_cast<uint32_t>(i));
      four |= uint32_t{code} << (8 * l);
    }
    out += static_cast<char>(internal::PackCodes4(four));
  }
  return out;
}

TEST(DevicePipelineTest, TernGradMatchesTheCpuCodec) {
  for (size_t bucket : {size_t{1}, size_t{3}, size_t{64}, size_t{512}, size_t{5000}}) {
    for (size_t n : kSizes) {
      for (uint64_t round : {0, 7}) {
        const std::vector<float> v = Values(n, static_cast<uint32_t>(n + bucket));
        auto codec = MakeOk(absl::StrCat("terngrad(bucket=", bucket, ")"), 42);
        EncodeContext ctx{.round = round, .slice_id = 3, .worker_id = 1};
        std::string bytes;
        ASSERT_TRUE(codec->Encode(v, ctx, &bytes).ok());
        ASSERT_EQ(Hex(TernGradPipeline(v, bucket, internal::RoundingSeed(42, ctx))), Hex(bytes))
            << "n " << n << " bucket " << bucket;
      }
    }
  }
}

// 3lc: scale, group bytes, the inclusive max-scan of non-zero groups, token sizes,
// their exclusive sum, then the tokens each group writes at its offset.
std::string ThreeLcPipeline(const std::vector<float>& v, double s) {
  const size_t n = v.size();
  uint32_t max_bits = 0;
  for (float x : v) max_bits = std::max(max_bits, internal::AbsBits(x));
  const double m = static_cast<double>(internal::FloatFromBits(max_bits)) * s;
  const auto scale = static_cast<float>(std::min(m, double{FLT_MAX}));
  const float half = std::max(0.5f * scale, FLT_TRUE_MIN);
  const size_t groups = (n + 4) / 5;
  std::vector<uint8_t> bytes(groups);
  std::vector<int32_t> last(groups);
  for (size_t g = 0; g < groups; ++g) {
    uint64_t digits = 0;
    for (size_t j = 0; j < 5; ++j) {
      const uint8_t d = 5 * g + j < n ? internal::TernaryDigit(v[5 * g + j], half) : 1;
      digits |= uint64_t{d} << (8 * j);
    }
    bytes[g] = internal::Pack3lcDigits(digits);
    const int32_t key = bytes[g] == internal::k3lcZeroGroup ? -1 : static_cast<int32_t>(g);
    last[g] = std::max(key, g > 0 ? last[g - 1] : -1);
  }
  auto run_before = [&](size_t g) { return static_cast<uint64_t>(static_cast<int64_t>(g) - 1 - (g > 0 ? last[g - 1] : -1)); };
  std::vector<uint32_t> sizes(groups), offsets(groups);
  for (size_t g = 0; g < groups; ++g) {
    sizes[g] = bytes[g] == internal::k3lcZeroGroup ? 0 : static_cast<uint32_t>(internal::ZeroRunTokenCount(run_before(g)) + 1);
    offsets[g] = g > 0 ? offsets[g - 1] + sizes[g - 1] : 0;
  }
  std::vector<unsigned char> tokens(groups + 1, 0xee);
  for (size_t g = 0; g < groups; ++g) {
    if (sizes[g] == 0) continue;
    internal::WriteZeroRun(run_before(g), tokens.data() + offsets[g]);
    tokens[offsets[g] + sizes[g] - 1] = bytes[g];
  }
  const uint64_t trailing = run_before(groups);
  const uint32_t end = offsets[groups - 1] + sizes[groups - 1];
  internal::WriteZeroRun(trailing, tokens.data() + end);
  std::string out = Header(PayloadFormat::kThreeLc, n);
  internal::PutF32(&out, scale);
  out.append(reinterpret_cast<const char*>(tokens.data()), end + internal::ZeroRunTokenCount(trailing));
  return out;
}

TEST(DevicePipelineTest, ThreeLcMatchesTheCpuCodec) {
  for (double s : {1.0, 1.9}) {
    auto codec = MakeOk(absl::StrCat("3lc(s=", s, ")"));
    for (size_t n : kSizes) {
      for (const std::vector<float>& v :
           {Values(n, static_cast<uint32_t>(n)), Sparse(n, static_cast<uint32_t>(n)), std::vector<float>(n, 0.0f)}) {
        ASSERT_EQ(Hex(ThreeLcPipeline(v, s)), Hex(EncodeOk(*codec, v))) << "n " << n << " s " << s;
      }
    }
  }
}

// top-k: the three radix digits with SelectBin, then tile counts, their exclusive sum
// and TopkSlot per value, as TopkWriteKernel does with kTopkTile = 4096 and 16 values a
// thread (a thread's prefix within the tile is the values before it).
std::vector<uint32_t> TopkPipeline(const std::vector<float>& x, uint32_t t, uint64_t need) {
  const size_t n = x.size();
  uint64_t greater = 0, equal = 0;
  std::vector<uint32_t> kept;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t key = internal::AbsBits(x[i]);
    const int64_t slot = internal::TopkSlot(key > t, key == t, greater, equal, need);
    if (slot >= 0) {
      EXPECT_EQ(static_cast<size_t>(slot), kept.size());
      kept.push_back(static_cast<uint32_t>(i));
    }
    greater += key > t;
    equal += key == t;
  }
  return kept;
}

std::pair<uint32_t, uint64_t> RadixSelect(const std::vector<float>& x, uint64_t k) {
  const int shifts[3] = {20, 10, 0}, bits[3] = {11, 10, 10};
  uint32_t prefix = 0;
  for (int d = 0; d < 3; ++d) {
    std::vector<uint32_t> hist(size_t{1} << bits[d], 0);
    const int high = shifts[d] + bits[d];
    for (float v : x) {
      const uint32_t key = internal::AbsBits(v);
      if ((high >= 32 ? 0u : key >> high) == prefix) ++hist[(key >> shifts[d]) & (hist.size() - 1)];
    }
    uint64_t above = 0;
    const uint32_t digit = internal::SelectBin(hist.data(), static_cast<uint32_t>(hist.size()), k, &above);
    prefix = (prefix << bits[d]) | digit;
    k -= above;
  }
  return {prefix, k};
}

TEST(DevicePipelineTest, TopkRadixSelectKeepsTheCpuCoordinates) {
  for (size_t n : kSizes) {
    for (double ratio : {0.001, 0.01, 0.3, 0.9}) {
      const std::vector<float> v = Values(n, static_cast<uint32_t>(n * 3));
      const size_t k = internal::KeepCount(ratio, n);
      if (k >= n) continue;
      const auto [t, need] = RadixSelect(v, k);
      ASSERT_EQ(TopkPipeline(v, t, need), internal::TopkExact(v, k)) << "n " << n << " k " << k;
    }
  }
}

// The whole payload: selection replayed, then EncodeSelected, for exact and sampled
// top-k with several stages (the sampled threshold as SparseEngine computes it).
TEST(DevicePipelineTest, TopkPayloadsMatchTheCpuCodec) {
  for (const char* spec : {"topk(0.01)", "topk(0.05)+varint+fp16", "topk(0.01, method=sampled)+raw+raw",
                           "topk(0.3, method=sampled)+bitmap+raw", "topk(0.02)+bloom(p0)+raw",
                           "threshold(0.5)+rle+fp16", "topk(1)"}) {
    for (size_t n : kSizes) {
      const std::vector<float> v = Values(n, static_cast<uint32_t>(n + 17));
      auto codec = MakeOk(spec, 9);
      EncodeContext ctx{.round = 3, .slice_id = 1, .worker_id = 2};
      std::string expected;
      ASSERT_TRUE(codec->Encode(v, ctx, &expected).ok());
      auto config = internal::ParseSparseSpec(codec->spec());
      ASSERT_TRUE(config.ok()) << config.status();
      const uint64_t stream = internal::StreamSeed(9, ctx);
      std::vector<uint32_t> kept;
      if (config->sparsifier == internal::Sparsifier::kThreshold) {
        kept = TopkPipeline(v, internal::AbsBits(static_cast<float>(config->tau)), UINT64_MAX);
      } else {
        const size_t k = internal::KeepCount(config->ratio, n);
        const double ratio = static_cast<double>(k) / static_cast<double>(n);
        const size_t samples = std::max<size_t>(1024, static_cast<size_t>(std::ceil(64 / ratio)));
        if (k >= n) {
          kept = TopkPipeline(v, 0, UINT64_MAX);
        } else if (config->sampled && 2 * samples < n) {
          std::vector<uint32_t> keys(samples);
          for (size_t j = 0; j < samples; ++j) keys[j] = internal::AbsBits(v[internal::BoundedRandom(internal::Mix64(stream + j), n)]);
          const size_t rank = std::clamp<size_t>(static_cast<size_t>(std::llround(ratio * static_cast<double>(samples))), 1, samples);
          std::nth_element(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(rank - 1), keys.end(), std::greater<uint32_t>());
          kept = TopkPipeline(v, keys[rank - 1], UINT64_MAX);
          if (kept.size() > 2 * k) kept.clear();
        }
        if (kept.empty()) {
          const auto [t, need] = RadixSelect(v, k);
          kept = TopkPipeline(v, t, need);
        }
      }
      const auto gather = [&](std::span<const uint32_t> sent, std::span<float> out) {
        for (size_t j = 0; j < sent.size(); ++j) out[j] = v[sent[j]];
        return absl::OkStatus();
      };
      std::string bytes;
      ASSERT_TRUE(internal::EncodeSelected(*config, kept, n, stream, gather, &bytes, nullptr, nullptr).ok());
      ASSERT_EQ(Hex(bytes), Hex(expected)) << spec << " n " << n;
    }
  }
}

// ---- CodecOptions::device ----

TEST(CudaRequestedTest, EncodesTheCpuBytesAndSaysWhereItRan) {
  const absl::StatusOr<std::string> device = gpu::CudaDevice();
  for (const char* spec : {"fp16", "bf16", "sign", "terngrad", "3lc(s=1.5)", "topk(0.01)+varint+fp16", "int8"}) {
    const std::vector<float> v = Values(4097, 5);
    auto cpu = MakeOk(spec, 3);
    auto requested = MakeCodec(spec, CodecOptions{.seed = 3, .device = core::Device::kCuda});
    ASSERT_TRUE(requested.ok()) << requested.status();
    EXPECT_EQ((*requested)->spec(), cpu->spec());
    EXPECT_THAT(cpu->device_note(), IsEmpty());
    for (uint64_t round : {0, 1}) {
      const std::string got = EncodeOk(**requested, v, round), want = EncodeOk(*cpu, v, round);
      if (device.ok() && std::string_view(spec) == "sign") {
        ExpectSameSignPayload(got, want, v.size());  // the scale: within one ulp on a device
      } else {
        EXPECT_EQ(Hex(got), Hex(want)) << spec;
      }
    }
    const std::string note((*requested)->device_note());
    if (!device.ok()) {
      EXPECT_EQ(note, absl::StrCat("device=cuda requested but unavailable (", device.status().message(),
                                   "); encoding on the CPU"));
    } else if (std::string_view(spec) == "int8") {
      EXPECT_THAT(note, HasSubstr("no GPU encoder for 'int8(bucket=512)'"));
    } else {
      EXPECT_THAT(note, IsEmpty()) << spec;
    }
  }
}

TEST(CudaRequestedTest, RefusesWhatTheCpuCodecRefuses) {
  auto requested = MakeCodec("3lc", CodecOptions{.device = core::Device::kCuda});
  ASSERT_TRUE(requested.ok());
  std::vector<float> v(10, 1.0f);
  v[7] = std::numeric_limits<float>::quiet_NaN();
  std::string out = "unchanged";
  const absl::Status s = (*requested)->Encode(v, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("value 7"));
  EXPECT_EQ(out, "unchanged");
}

// DeviceEncoder is in every build; without a device (or without CUDA in the build) it
// says why, with gpu::CudaDevice()'s status, and so does the bench's timing.
TEST(DeviceEncoderWithoutDeviceTest, SaysWhyWithoutADevice) {
  if (gpu::CudaDevice().ok()) GTEST_SKIP() << "a CUDA device exists";
  auto encoder = DeviceEncoder::Make("fp16", {}, 10, false);
  EXPECT_EQ(encoder.status(), gpu::CudaDevice().status());
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kUnavailable);
  const std::vector<float> values(10, 1.0f);
  EXPECT_EQ(TimeDeviceEncode("fp16", {}, values, 1).status(), gpu::CudaDevice().status());
}

}  // namespace
}  // namespace ps::codecs
