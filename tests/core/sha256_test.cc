// core::Sha256, the portable SHA-256 under the layout hash: FIPS 180-4's examples, and
// OpenSSL's digest of every length across the padding's block boundaries.
#include "core/sha256.h"

#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <cstring>
#include <random>
#include <string>

#include "absl/strings/escaping.h"

namespace ps::core {
namespace {

std::string Hex(const std::array<uint8_t, kSha256Bytes>& digest) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

TEST(Sha256Test, MatchesTheStandardsExamples) {
  EXPECT_EQ(Hex(Sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(Sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, AgreesWithOpenSslForEveryLengthUpTo300Bytes) {
  std::mt19937 rng(7);
  std::string data;
  for (size_t n = 0; n <= 300; ++n) {
    unsigned char want[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), want);
    const std::array<uint8_t, kSha256Bytes> got = Sha256(data);
    EXPECT_EQ(std::memcmp(got.data(), want, sizeof(want)), 0) << n << " bytes";
    data.push_back(static_cast<char>(rng()));
  }
}

}  // namespace
}  // namespace ps::core
