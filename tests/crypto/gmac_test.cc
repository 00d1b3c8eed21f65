// crypto::Gmac: a published answer, OpenSSL's AES-256-GCM on every size and split, and
// the fast path (where this CPU has it) against OpenSSL byte for byte.
#include "crypto/gmac.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace ps::crypto {
namespace {

std::string Hex(const GmacTag& tag) {
  std::string s;
  for (uint8_t b : tag) {
    char h[3];
    std::snprintf(h, sizeof(h), "%02x", b);
    s += h;
  }
  return s;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::array<uint8_t, kGmacNonceBytes> RandomNonce(std::mt19937_64& rng) {
  std::array<uint8_t, kGmacNonceBytes> nonce;
  for (uint8_t& b : nonce) b = static_cast<uint8_t>(rng());
  return nonce;
}

GmacTag TagOf(const Gmac& gmac, std::span<const uint8_t, kGmacNonceBytes> nonce,
              std::span<const std::string_view> pieces, bool openssl) {
  GmacTag tag{};
  EXPECT_TRUE(openssl ? gmac.TagWithOpenSsl(nonce, pieces, &tag) : gmac.Tag(nonce, pieces, &tag));
  return tag;
}

TEST(GmacTest, GivesThePublishedTagOfAnEmptyMessage) {
  // The GCM specification's test case 13 (McGrew and Viega): K = 0^256, IV = 0^96, no
  // plaintext, no additional data.
  auto gmac = Gmac::FromKey(std::string(kGmacKeyBytes, '\0'));
  ASSERT_TRUE(gmac.ok()) << gmac.status();
  const std::array<uint8_t, kGmacNonceBytes> nonce{};
  EXPECT_EQ(Hex(TagOf(*gmac, nonce, {}, false)), "530f8afbc74536b9a963b4f1c4cb738b");
  EXPECT_EQ(Hex(TagOf(*gmac, nonce, {}, true)), "530f8afbc74536b9a963b4f1c4cb738b");
}

TEST(GmacTest, GivesThePublishedTagOfAMessage) {
  // NIST CAVP gcmEncryptExtIV256.rsp, [PTlen = 0] [AADlen = 128], count 0.
  std::string key;
  for (const char* p = "78dc4e0aaf52d935c3c01eea57428f00ca1fd475f5da86a49c8dd73d68c8e223"; *p;
       p += 2) {
    key += static_cast<char>(std::stoi(std::string(p, 2), nullptr, 16));
  }
  const std::array<uint8_t, kGmacNonceBytes> nonce = {0xd7, 0x9c, 0xf2, 0x2d, 0x50, 0x4c,
                                                      0xc7, 0x93, 0xc3, 0xfb, 0x6c, 0x8a};
  const std::string aad = {'\xb9', '\x6b', '\xaa', '\x8c', '\x1c', '\x75', '\xa6', '\x71',
                           '\xbf', '\xb2', '\xd0', '\x8d', '\x06', '\xbe', '\x5f', '\x36'};
  auto gmac = Gmac::FromKey(key);
  ASSERT_TRUE(gmac.ok()) << gmac.status();
  const std::string_view piece(aad);
  EXPECT_EQ(Hex(TagOf(*gmac, nonce, {&piece, 1}, false)), "3e5d486aa2e30b22e040b85723a06e76");
  EXPECT_EQ(Hex(TagOf(*gmac, nonce, {&piece, 1}, true)), "3e5d486aa2e30b22e040b85723a06e76");
}

TEST(GmacTest, RefusesAKeyOfAnotherSize) {
  for (size_t n : {0, 16, 31, 33}) {
    auto gmac = Gmac::FromKey(std::string(n, 'k'));
    ASSERT_FALSE(gmac.ok()) << n;
    EXPECT_EQ(gmac.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(gmac.status().message().find("32 bytes, got " + std::to_string(n)), std::string::npos)
        << gmac.status();
  }
}

// Every size up to 1100 bytes (each step of 32 blocks, each short group, each partial
// block) and a datagram's, one piece, under several keys and nonces.
TEST(GmacTest, EqualsOpenSslsAesGcmTagForEverySize) {
  if (!Gmac::FastPath()) {
    GTEST_SKIP() << "this CPU lacks AVX-512 with VPCLMULQDQ and AES-NI: Tag is OpenSSL's "
                    "own, compared with itself here";
  }
  std::mt19937_64 rng(46);
  for (int k = 0; k < 3; ++k) {
    auto gmac = Gmac::FromKey(RandomBytes(rng, kGmacKeyBytes));
    ASSERT_TRUE(gmac.ok());
    std::vector<size_t> sizes;
    for (size_t n = 0; n <= 1100; ++n) sizes.push_back(n);
    for (size_t n : {4095, 4096, 4097, 32768 + 56 + 4, 65507}) sizes.push_back(n);
    for (size_t n : sizes) {
      const std::string data = RandomBytes(rng, n);
      const auto nonce = RandomNonce(rng);
      const std::string_view piece(data);
      ASSERT_EQ(Hex(TagOf(*gmac, nonce, {&piece, 1}, false)),
                Hex(TagOf(*gmac, nonce, {&piece, 1}, true)))
          << "key " << k << ", " << n << " bytes";
    }
  }
}

// A datagram is signed in pieces (header and codec, payload, or a borrowed push's head
// byte and the caller's values): every split, empty pieces included, gives the tag of
// the concatenation.
TEST(GmacTest, TagOfPiecesIsTheTagOfTheirConcatenation) {
  std::mt19937_64 rng(7);
  auto gmac = Gmac::FromKey(RandomBytes(rng, kGmacKeyBytes));
  ASSERT_TRUE(gmac.ok());
  for (size_t n : {0, 1, 15, 16, 17, 60, 513, 1000, 32840}) {
    const std::string data = RandomBytes(rng, n);
    const auto nonce = RandomNonce(rng);
    const std::string_view whole(data);
    const GmacTag expected = TagOf(*gmac, nonce, {&whole, 1}, true);
    for (int trial = 0; trial < 60; ++trial) {
      // Empty views with no data at all (default-made ones) among them on odd trials.
      std::vector<std::string_view> pieces;
      size_t at = 0;
      while (at < n || pieces.size() < 2) {
        const size_t len = std::min<size_t>(n - at, rng() % (trial < 30 ? 40 : 2000));
        pieces.push_back(whole.substr(at, len));
        if (trial % 2 == 1) pieces.push_back(std::string_view());
        at += len;
      }
      ASSERT_EQ(Hex(TagOf(*gmac, nonce, pieces, false)), Hex(expected))
          << n << " bytes in " << pieces.size() << " pieces, trial " << trial;
      ASSERT_EQ(Hex(TagOf(*gmac, nonce, pieces, true)), Hex(expected));
    }
  }
}

// The fast path reads a message's last group of blocks with a masked load: a message
// that ends where a page ends, before one the process may not read, must not fault.
TEST(GmacTest, ReadsNoByteAfterTheMessage) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  char* base = static_cast<char*>(map);
  ASSERT_EQ(::mprotect(base + page, page, PROT_NONE), 0);
  std::mt19937_64 rng(11);
  auto gmac = Gmac::FromKey(RandomBytes(rng, kGmacKeyBytes));
  ASSERT_TRUE(gmac.ok());
  const auto nonce = RandomNonce(rng);
  for (size_t n = 1; n <= 600; ++n) {
    const std::string data = RandomBytes(rng, n);
    std::memcpy(base + page - n, data.data(), n);
    const std::string_view at_edge(base + page - n, n);
    const std::string_view copy(data);
    EXPECT_EQ(Hex(TagOf(*gmac, nonce, {&at_edge, 1}, false)),
              Hex(TagOf(*gmac, nonce, {&copy, 1}, true)))
        << n;
  }
  ::munmap(map, 2 * page);
}

TEST(GmacTest, EveryFlippedBitOfKeyNonceOrMessageChangesTheTag) {
  std::mt19937_64 rng(3);
  const std::string key = RandomBytes(rng, kGmacKeyBytes);
  const std::string data = RandomBytes(rng, 100);
  const auto nonce = RandomNonce(rng);
  auto gmac = Gmac::FromKey(key);
  ASSERT_TRUE(gmac.ok());
  const std::string_view piece(data);
  const GmacTag tag = TagOf(*gmac, nonce, {&piece, 1}, false);
  for (size_t bit = 0; bit < 8 * data.size(); ++bit) {
    std::string bad = data;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    const std::string_view p(bad);
    EXPECT_NE(TagOf(*gmac, nonce, {&p, 1}, false), tag) << "message bit " << bit;
  }
  for (size_t bit = 0; bit < 8 * nonce.size(); ++bit) {
    auto bad = nonce;
    bad[bit / 8] = static_cast<uint8_t>(bad[bit / 8] ^ (1 << (bit % 8)));
    EXPECT_NE(TagOf(*gmac, bad, {&piece, 1}, false), tag) << "nonce bit " << bit;
  }
  for (size_t bit = 0; bit < 8 * key.size(); ++bit) {
    std::string bad = key;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    auto other = Gmac::FromKey(bad);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(TagOf(*other, nonce, {&piece, 1}, false), tag) << "key bit " << bit;
  }
  // A trailing zero byte is another message (the length block tells them apart).
  const std::string longer = data + '\0';
  const std::string_view l(longer);
  EXPECT_NE(TagOf(*gmac, nonce, {&l, 1}, false), tag);
}

}  // namespace
}  // namespace ps::crypto
