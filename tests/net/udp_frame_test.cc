#include "net/udp_frame.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ps::net {
namespace {

using ::testing::HasSubstr;

std::string Bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

std::string KeyBytes() {
  std::string k(kDatagramKeyBytes, '\0');
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<char>(i);
  return k;
}

DatagramKey TestKey() {
  auto key = DatagramKey::FromBytes(KeyBytes());
  EXPECT_TRUE(key.ok()) << key.status();
  return *key;
}

// A fixed nonce for deterministic datagrams: 0xa0 ... 0xab.
std::string TestNonce() {
  std::string n(kDatagramNonceBytes, '\0');
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<char>(0xa0 + i);
  return n;
}

// AES-256-GCM's tag of `data` as additional data and no plaintext, by OpenSSL:
// independent of crypto::Gmac's own code, which DatagramKey runs on CPUs with AVX-512.
std::string ReferenceMac(std::string_view key, std::string_view nonce, std::string_view data) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int len = 0;
  unsigned char none[1];
  unsigned char tag[16];
  EXPECT_EQ(EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr,
                               reinterpret_cast<const unsigned char*>(key.data()),
                               reinterpret_cast<const unsigned char*>(nonce.data())),
            1);
  if (!data.empty()) {
    EXPECT_EQ(EVP_EncryptUpdate(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(data.data()),
                                static_cast<int>(data.size())),
              1);
  }
  EXPECT_EQ(EVP_EncryptFinal_ex(ctx, none, &len), 1);
  EXPECT_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag), 1);
  EVP_CIPHER_CTX_free(ctx);
  return std::string(reinterpret_cast<const char*>(tag), sizeof(tag));
}

std::string AsString(const std::array<uint8_t, kDatagramMacBytes>& mac) {
  return std::string(mac.begin(), mac.end());
}

std::string AsString(const DatagramNonce& nonce) { return std::string(nonce.begin(), nonce.end()); }

DatagramHeader GoldenHeader() {
  DatagramHeader h;
  h.session_id = 0x1122334455667788ull;
  h.worker_id = 7;
  h.slice_id = 42;
  h.round = 1000;
  h.chunk_elems = 2;
  h.chunk_index = 1;
  h.chunk_count = 3;
  return h;
}

// The fp32 codec's encoding of {1.0f, -2.0f}: version byte, then little-endian floats.
const std::string kGoldenPayload = Bytes({0x01, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0});

std::string Encode(const DatagramHeader& h, std::string_view codec, std::string_view payload) {
  std::string out;
  absl::Status s = EncodeDatagram(h, codec, payload, TestKey(), &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// The golden datagram, under TestNonce().
std::string Golden() {
  std::string out;
  absl::Status s =
      EncodeDatagramWithNonce(GoldenHeader(), TestNonce(), "fp32", kGoldenPayload, TestKey(), &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(UdpFrameTest, EncodesTheGoldenDatagramByteForByte) {
  const std::string signed_part =
      Bytes({'P',  'S',  'U',  '1',                           // magic
             0x04,                                            // version
             0x04,                                            // codec_len
             0x00,                                            // kind: chunk
             0x00,                                            // reserved
             0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // session_id
             0x07, 0x00, 0x00, 0x00,                          // worker_id
             0x2a, 0x00, 0x00, 0x00,                          // slice_id 42
             0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // round 1000
             0x02, 0x00, 0x00, 0x00,                          // chunk_elems
             0x01, 0x00,                                      // chunk_index
             0x03, 0x00,                                      // chunk_count
             0x09, 0x00, 0x00, 0x00}) +                       // payload_len
      TestNonce() + "fp32" + kGoldenPayload;
  ASSERT_EQ(signed_part.size(), kDatagramHeaderBytes + 4 + 9);
  // Python (cryptography): AESGCM(bytes(range(32))).encrypt(
  //     bytes(range(0xa0, 0xac)), b"", signed_part)
  const std::string mac = Bytes({0x7c, 0xb0, 0x29, 0xc6, 0x7d, 0x8f, 0x55, 0xef, 0x0e, 0xcf, 0x37,
                                 0xbb, 0xb4, 0xff, 0x12, 0x13});
  EXPECT_EQ(ReferenceMac(KeyBytes(), TestNonce(), signed_part), mac);

  const std::string datagram = Golden();
  EXPECT_EQ(datagram, signed_part + mac);
  EXPECT_EQ(datagram.size(), DatagramOverhead(4) + kGoldenPayload.size());
  EXPECT_EQ(AsString(TestKey().Mac(TestNonce(), signed_part)), mac);
}

TEST(UdpFrameTest, MacMatchesTheOneShotCipherForManySizes) {
  const DatagramKey key = TestKey();
  std::string data;
  // Around GHASH's 16-byte blocks and 512-byte steps, and a large input.
  for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 128, 511, 512, 513, 1400, 32768, 65491}) {
    data.resize(n);
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>((i * 131 + n) & 0xff);
    EXPECT_EQ(AsString(key.Mac(TestNonce(), data)), ReferenceMac(KeyBytes(), TestNonce(), data))
        << n;
    EXPECT_TRUE(key.Verify(TestNonce(), data, ReferenceMac(KeyBytes(), TestNonce(), data))) << n;
  }
}

// The tag of pieces is the tag of their concatenation, wherever the cuts fall: inside
// and at the edges of GHASH's 16-byte blocks and 512-byte steps, with empty pieces among
// them.
TEST(UdpFrameTest, MacOfPiecesIsTheMacOfTheirConcatenation) {
  const DatagramKey key = TestKey();
  std::string data(700, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 37 + 5) & 0xff);
  const std::string whole = ReferenceMac(KeyBytes(), TestNonce(), data);
  for (size_t a : {0, 1, 15, 16, 17, 70, 255, 256, 257, 400, 511, 512, 513}) {
    for (size_t b : {0, 3, 16, 33, 130, 186, 187, 300}) {
      const std::string_view v(data);
      const size_t cut2 = std::min(v.size(), a + b);
      const std::string_view pieces[] = {v.substr(0, a), v.substr(a, cut2 - a), std::string_view(),
                                         v.substr(cut2)};
      EXPECT_EQ(AsString(key.Mac(TestNonce(), pieces)), whole) << a << " " << b;
    }
  }
}

// The pieces a scatter-gather send takes are EncodeDatagram's bytes, cut; bad input is
// refused with EncodeDatagram's message.
TEST(UdpFrameTest, SignedPiecesAreTheEncodedDatagram) {
  SignedDatagram parts;
  const std::string_view payload[] = {kGoldenPayload};
  ASSERT_TRUE(
      SignDatagramWithNonce(GoldenHeader(), TestNonce(), "fp32", payload, TestKey(), &parts).ok());
  EXPECT_EQ(parts.head.size(), kDatagramHeaderBytes + 4);
  EXPECT_EQ(parts.head + kGoldenPayload + AsString(parts.mac), Golden());

  // A fresh nonce each time, and what it signs verifies after a parse.
  SignedDatagram again;
  ASSERT_TRUE(SignDatagram(GoldenHeader(), "fp32", kGoldenPayload, TestKey(), &again).ok());
  const std::string bytes = again.head + kGoldenPayload + AsString(again.mac);
  absl::StatusOr<DatagramView> view = ParseDatagram(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_NE(view->nonce, TestNonce());
  EXPECT_TRUE(TestKey().Verify(view->nonce, view->signed_bytes, view->mac));
  EXPECT_EQ(view->payload, kGoldenPayload);

  SignedDatagram refused;
  DatagramHeader bad = GoldenHeader();
  bad.chunk_index = bad.chunk_count;
  const absl::Status st = SignDatagram(bad, "fp32", kGoldenPayload, TestKey(), &refused);
  std::string unused;
  const absl::Status encoded = EncodeDatagram(bad, "fp32", kGoldenPayload, TestKey(), &unused);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), encoded.message());
  EXPECT_THAT(std::string(st.message()), HasSubstr("chunk_index"));
}

// A payload given in pieces (a borrowed push: the codec's head, then the caller's
// values) signs to the bytes of the same payload given whole, wherever it is cut; an
// end's entries are checked across its pieces; more than three pieces are refused.
TEST(UdpFrameTest, APayloadInPiecesSignsAsTheWholePayload) {
  SignedDatagram whole;
  const std::string_view one[] = {kGoldenPayload};
  ASSERT_TRUE(
      SignDatagramWithNonce(GoldenHeader(), TestNonce(), "fp32", one, TestKey(), &whole).ok());
  EXPECT_EQ(whole.head + kGoldenPayload + AsString(whole.mac), Golden());
  const std::string_view v = kGoldenPayload;
  for (size_t cut = 0; cut <= v.size(); ++cut) {
    const std::array<std::string_view, 2> pieces = {v.substr(0, cut), v.substr(cut)};
    SignedDatagram parts;
    ASSERT_TRUE(
        SignDatagramWithNonce(GoldenHeader(), TestNonce(), "fp32", pieces, TestKey(), &parts).ok())
        << cut;
    EXPECT_EQ(parts.head, whole.head) << cut;
    EXPECT_EQ(AsString(parts.mac), AsString(whole.mac)) << cut;
  }

  DatagramHeader end = GoldenHeader();
  end.kind = DatagramKind::kEnd;
  end.chunk_index = 0;
  std::string entries;
  AppendEndEntry(9, 5, &entries);
  entries[6] = 1;  // the entry's reserved field, not 0, in the second piece
  const std::array<std::string_view, 2> split = {std::string_view(entries).substr(0, 3),
                                                 std::string_view(entries).substr(3)};
  SignedDatagram refused;
  const absl::Status bad_end = SignDatagram(end, "fp32", split, TestKey(), &refused);
  EXPECT_EQ(bad_end.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_end.message()), HasSubstr("reserved"));

  const std::array<std::string_view, 4> four = {v.substr(0, 1), v.substr(1, 1), v.substr(2, 1),
                                                v.substr(3)};
  const absl::Status too_many = SignDatagram(GoldenHeader(), "fp32", four, TestKey(), &refused);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_many.message()), HasSubstr("4 pieces"));
}

// Every datagram gets its own nonce, from a key and from its copies alike; datagrams
// from another key object made of the same bytes start elsewhere. All verify.
TEST(UdpFrameTest, EveryDatagramHasAFreshNonce) {
  const DatagramKey key = TestKey();
  const DatagramKey copy = key;
  const DatagramKey same_bytes = TestKey();
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    for (const DatagramKey* k : {&key, &copy, &same_bytes}) {
      std::string d;
      ASSERT_TRUE(EncodeDatagram(GoldenHeader(), "fp32", kGoldenPayload, *k, &d).ok());
      auto view = ParseDatagram(d);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_TRUE(key.Verify(view->nonce, view->signed_bytes, view->mac));
      EXPECT_TRUE(seen.insert(std::string(view->nonce)).second) << "nonce repeated at " << i;
    }
  }
  // Consecutive nonces of one key share the prefix and count up by one.
  const std::string a = AsString(key.NextNonce()), b = AsString(key.NextNonce());
  EXPECT_EQ(a.substr(0, 4), b.substr(0, 4));
  EXPECT_NE(a.substr(4), b.substr(4));
  // A nonce of another size is refused, by the encoder and by Verify.
  std::string d;
  const absl::Status s =
      EncodeDatagramWithNonce(GoldenHeader(), "short", "fp32", kGoldenPayload, key, &d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("a nonce has 12 bytes, got 5"));
  EXPECT_FALSE(key.Verify("short", "data", std::string(16, '\0')));
}

TEST(UdpFrameTest, ParsesEveryFieldBack) {
  DatagramHeader h;
  h.session_id = 0xfedcba9876543210ull;
  h.worker_id = 0xffffffffu;
  h.slice_id = 0x80000001u;
  h.round = 0xffffffffffffffffull;
  h.chunk_elems = 0xffffffffu;
  h.chunk_index = 0xfffe;
  h.chunk_count = 0xffff;
  const std::string codec = "topk(0.01, m=2)+bloom(p0,fpr=1e-3)+fp16-x_A9";
  const std::string payload(1000, '\xab');
  const std::string datagram = Encode(h, codec, payload);
  auto view = ParseDatagram(datagram);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header, h);
  EXPECT_EQ(view->codec, codec);
  EXPECT_EQ(view->payload, payload);
  EXPECT_EQ(view->signed_bytes, std::string_view(datagram).substr(0, datagram.size() - 16));
  EXPECT_EQ(view->mac, std::string_view(datagram).substr(datagram.size() - 16));
  // The views point into the buffer, not into copies.
  EXPECT_EQ(view->signed_bytes.data(), datagram.data());
  EXPECT_EQ(view->codec.data(), datagram.data() + kDatagramHeaderBytes);
  EXPECT_TRUE(TestKey().Verify(view->nonce, view->signed_bytes, view->mac));
}

TEST(UdpFrameTest, EncodesAnEndAsKindOneWithoutPayload) {
  DatagramHeader h = GoldenHeader();
  h.kind = DatagramKind::kEnd;
  h.chunk_index = 0;
  std::string datagram;
  ASSERT_TRUE(EncodeDatagramWithNonce(h, TestNonce(), "fp32", "", TestKey(), &datagram).ok());
  EXPECT_EQ(datagram.size(), DatagramOverhead(4));
  EXPECT_EQ(datagram[6], 1);  // kind
  EXPECT_EQ(datagram[7], 0);  // reserved
  auto view = ParseDatagram(datagram);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header, h);
  EXPECT_TRUE(view->payload.empty());
  EXPECT_TRUE(TestKey().Verify(view->nonce, view->signed_bytes, view->mac));
  // The kind is signed: a chunk turned into an end (or back) fails its MAC.
  std::string flipped = datagram;
  flipped[6] = 0;
  auto chunk = ParseDatagram(flipped);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->header.kind, DatagramKind::kChunk);
  EXPECT_FALSE(TestKey().Verify(chunk->nonce, chunk->signed_bytes, chunk->mac));

  // An end's payload is whole entries, and it names chunk 0.
  std::string out;
  absl::Status st = EncodeDatagram(h, "fp32", "x", TestKey(), &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("an end carries chunk_index 0 and 8 payload bytes per further push, not "
                        "chunk_index 0 and 1 payload bytes"));
  h.chunk_index = 2;
  st = EncodeDatagram(h, "fp32", "", TestKey(), &out);
  EXPECT_THAT(std::string(st.message()), HasSubstr("not chunk_index 2 and 0 payload bytes"));
}

TEST(UdpFrameTest, AnEndNamesFurtherPushesInItsPayload) {
  DatagramHeader h = GoldenHeader();  // slice 42, 3 chunks of 2 values
  h.kind = DatagramKind::kEnd;
  h.chunk_index = 0;
  std::string entries;
  AppendEndEntry(9, 5, &entries);
  AppendEndEntry(0x01020304, 0xfffe, &entries);
  EXPECT_EQ(entries, Bytes({9, 0, 0, 0, 5, 0, 0, 0, 4, 3, 2, 1, 0xfe, 0xff, 0, 0}));
  std::string datagram;
  ASSERT_TRUE(EncodeDatagramWithNonce(h, TestNonce(), "fp32", entries, TestKey(), &datagram).ok());
  auto view = ParseDatagram(datagram);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header, h);
  EXPECT_EQ(view->payload, entries);
  const std::vector<DatagramHeader> pushes = EndedPushes(view->header, view->payload);
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[0], h);
  DatagramHeader second = h;
  second.slice_id = 9;
  second.chunk_count = 5;
  EXPECT_EQ(pushes[1], second);
  DatagramHeader third = h;
  third.slice_id = 0x01020304;
  third.chunk_count = 0xfffe;
  EXPECT_EQ(pushes[2], third);

  // Every entry is checked, on both sides.
  const struct {
    std::string payload;
    const char* message;
  } bad[] = {
      {entries + "x", "not chunk_index 0 and 17 payload bytes"},
      {entries + Bytes({1, 0, 0, 0, 0, 0, 0, 0}), "entry 2 of an end has chunk_count 0"},
      {Bytes({1, 0, 0, 0, 1, 0, 1, 0}), "entry 0 of an end has reserved 1, must be 0"},
  };
  for (const auto& c : bad) {
    std::string out;
    absl::Status st = EncodeDatagram(h, "fp32", c.payload, TestKey(), &out);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message));
    // The same bytes through the parser: a chunk's datagram turned into this end.
    DatagramHeader chunk = GoldenHeader();
    chunk.chunk_index = 0;
    ASSERT_TRUE(EncodeDatagram(chunk, "fp32", c.payload, TestKey(), &out).ok());
    out[6] = 1;
    auto parsed = ParseDatagram(out);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.message));
  }

  // As many pushes as fill the largest datagram, and not one more.
  const size_t most = MaxEndedPushes(4);
  std::string full;
  for (size_t i = 1; i < most; ++i) AppendEndEntry(static_cast<uint32_t>(i), 1, &full);
  ASSERT_TRUE(EncodeDatagram(h, "fp32", full, TestKey(), &datagram).ok());
  EXPECT_LE(datagram.size(), kMaxDatagramBytes);
  EXPECT_GT(datagram.size() + kEndEntryBytes, kMaxDatagramBytes);
  view = ParseDatagram(datagram);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(EndedPushes(view->header, view->payload).size(), most);
  AppendEndEntry(0, 1, &full);
  EXPECT_FALSE(EncodeDatagram(h, "fp32", full, TestKey(), &datagram).ok());
}

TEST(UdpFrameTest, RoundTripsAnEmptyPayloadAndTheLargestDatagram) {
  const std::string empty = Encode(GoldenHeader(), "fp32", "");
  auto view = ParseDatagram(empty);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->payload.empty());

  const std::string codec = "fp16";
  const std::string payload(kMaxDatagramBytes - DatagramOverhead(codec.size()), 'z');
  const std::string largest = Encode(GoldenHeader(), codec, payload);
  EXPECT_EQ(largest.size(), kMaxDatagramBytes);
  view = ParseDatagram(largest);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->payload, payload);
  EXPECT_TRUE(TestKey().Verify(view->nonce, view->signed_bytes, view->mac));
}

TEST(UdpFrameTest, EncodeReplacesTheOutputAndAcceptsEveryCodecChar) {
  std::string out = "previous contents";
  const std::string codec = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.";
  ASSERT_EQ(codec.size(), kMaxDatagramCodecBytes);
  ASSERT_TRUE(EncodeDatagram(GoldenHeader(), codec, "p", TestKey(), &out).ok());
  EXPECT_EQ(out.substr(0, 4), "PSU1");
  ASSERT_TRUE(ParseDatagram(out).ok());
  ASSERT_TRUE(EncodeDatagram(GoldenHeader(), ",=()+ -", "p", TestKey(), &out).ok());
  ASSERT_TRUE(ParseDatagram(out).ok());
}

TEST(UdpFrameTest, ParseRefusesBadSizes) {
  const struct {
    size_t size;
    const char* message;
  } cases[] = {
      {0, "0 bytes is too short (at least 73)"},
      {72, "72 bytes is too short"},  // header and MAC, no codec
      {kMaxDatagramBytes + 1, "65508 bytes is too long (at most 65507)"},
  };
  for (const auto& c : cases) {
    std::string d = Golden();
    d.resize(c.size);
    auto view = ParseDatagram(d);
    ASSERT_FALSE(view.ok()) << c.size;
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(view.status().message(), HasSubstr(c.message));
  }
}

TEST(UdpFrameTest, ParseRefusesEachMalformedField) {
  // Each case overwrites bytes of the golden datagram (85 bytes, codec "fp32", payload 9
  // bytes) at `offset`; `resize` then changes its size by that many bytes.
  const struct {
    const char* name;
    size_t offset;
    std::vector<uint8_t> bytes;
    int resize;
    const char* message;
  } cases[] = {
      {"magic", 3, {'2'}, 0, "bad magic"},
      {"version", 4, {1}, 0, "unknown version 1 (this build reads 4)"},
      {"version 2", 4, {2}, 0, "unknown version 2 (this build reads 4)"},
      {"version 3", 4, {3}, 0, "unknown version 3 (this build reads 4)"},
      {"version 5", 4, {5}, 0, "unknown version 5"},
      {"version 0", 4, {0}, 0, "unknown version 0"},
      {"codec_len 0", 5, {0}, 0, "codec_len 0 is outside [1, 64]"},
      {"codec_len 65", 5, {65}, 0, "codec_len 65 is outside"},
      {"codec_len 255", 5, {255}, 0, "codec_len 255 is outside"},
      {"kind 2", 6, {2}, 0, "unknown kind 2 (0: chunk, 1: end)"},
      {"kind 255", 6, {0xff}, 0, "unknown kind 255"},
      {"an end with a chunk's payload",
       6,
       {1},
       0,
       "an end carries chunk_index 0 and 8 payload bytes per further push, not chunk_index 1 and "
       "9 payload bytes"},
      {"reserved", 7, {0x80}, 0, "reserved is 128, must be 0"},
      {"payload_len short",
       40,
       {8},
       0,
       "payload_len 8 does not match the size: 85 bytes with codec_len 4 leave 9"},
      {"payload_len long", 40, {10}, 0, "payload_len 10 does not"},
      {"payload_len huge", 40, {0xf7, 0xff, 0xff, 0xff}, 0, "payload_len 4294967287 does not"},
      {"one byte more", 0, {}, 1, "payload_len 9 does not match the size: 86 bytes"},
      {"one byte less", 0, {}, -1, "payload_len 9 does not match the size: 84 bytes"},
      {"codec_len eats the payload",
       5,
       {5},
       0,
       "payload_len 9 does not match the size: 85 bytes with codec_len 5 leave 8"},
      {"codec_len beyond the datagram", 5, {64}, 0, "codec_len 64 leave -51"},
      {"codec char", 58, {'/'}, 0, "codec byte 2 (0x2f) is not in [A-Za-z0-9_.,=()+ -]"},
      {"codec nul", 59, {0}, 0, "codec byte 3 (0x00)"},
      {"codec high bit", 56, {0xe6}, 0, "codec byte 0 (0xe6)"},
      {"chunk_count 0", 38, {0, 0}, 0, "chunk_count is 0"},
      {"chunk_index = count", 36, {3, 0}, 0, "chunk_index 3 is not below chunk_count 3"},
      {"chunk_index > count", 36, {0xff, 0xff}, 0, "chunk_index 65535 is not below chunk_count 3"},
      {"chunk_elems 0", 32, {0, 0, 0, 0}, 0, "chunk_elems is 0"},
  };
  for (const auto& c : cases) {
    std::string d = Golden();
    ASSERT_EQ(d.size(), 85u);
    for (size_t i = 0; i < c.bytes.size(); ++i) d[c.offset + i] = static_cast<char>(c.bytes[i]);
    d.resize(static_cast<size_t>(static_cast<int>(d.size()) + c.resize));
    auto view = ParseDatagram(d);
    ASSERT_FALSE(view.ok()) << c.name;
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(view.status().message(), HasSubstr(c.message)) << c.name;
  }
}

TEST(UdpFrameTest, ParseDoesNotCheckTheMac) {
  std::string d = Golden();
  d.back() ^= 1;
  auto view = ParseDatagram(d);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_FALSE(TestKey().Verify(view->nonce, view->signed_bytes, view->mac));
}

TEST(UdpFrameTest, VerifyFailsForAnotherKey) {
  const std::string d = Golden();
  auto view = ParseDatagram(d);
  ASSERT_TRUE(view.ok());
  std::string other = KeyBytes();
  other[31] ^= 0x01;  // the last key byte only
  auto key = DatagramKey::FromBytes(other);
  ASSERT_TRUE(key.ok());
  EXPECT_FALSE(key->Verify(view->nonce, view->signed_bytes, view->mac));
  auto random = DatagramKey::Random();
  ASSERT_TRUE(random.ok()) << random.status();
  EXPECT_FALSE(random->Verify(view->nonce, view->signed_bytes, view->mac));
}

TEST(UdpFrameTest, VerifyFailsForEveryFlippedBit) {
  const std::string d = Golden();
  const DatagramKey key = TestKey();
  const size_t signed_size = d.size() - kDatagramMacBytes;
  auto nonce_of = [](std::string_view datagram) { return datagram.substr(44, 12); };
  ASSERT_TRUE(key.Verify(nonce_of(d), std::string_view(d).substr(0, signed_size),
                         std::string_view(d).substr(signed_size)));
  // Nonce bits included: a datagram whose nonce changed does not verify either.
  for (size_t bit = 0; bit < d.size() * 8; ++bit) {
    std::string bad = d;
    bad[bit / 8] ^= static_cast<char>(1u << (bit % 8));
    EXPECT_FALSE(key.Verify(nonce_of(bad), std::string_view(bad).substr(0, signed_size),
                            std::string_view(bad).substr(signed_size)))
        << "bit " << bit;
  }
}

TEST(UdpFrameTest, VerifyFailsForATruncatedOrLongerMac) {
  const std::string d = Golden();
  const DatagramKey key = TestKey();
  const std::string_view signed_bytes = std::string_view(d).substr(0, d.size() - 16);
  const std::string mac = d.substr(d.size() - 16);
  const std::string n = TestNonce();
  for (size_t k = 0; k < mac.size(); ++k) EXPECT_FALSE(key.Verify(n, signed_bytes, mac.substr(0, k)));
  const std::string full = ReferenceMac(KeyBytes(), n, signed_bytes);  // 16 bytes
  EXPECT_EQ(full, mac);
  EXPECT_TRUE(key.Verify(n, signed_bytes, full));
  EXPECT_FALSE(key.Verify(n, signed_bytes, mac + '\0'));
  EXPECT_FALSE(key.Verify(n, signed_bytes.substr(1), mac));
  EXPECT_FALSE(key.Verify(n, std::string(signed_bytes) + '\0', mac));
}

TEST(UdpFrameTest, KeyRefusesWrongSizesAndRandomKeysDiffer) {
  for (size_t n : {0, 16, 31, 33, 64}) {
    auto key = DatagramKey::FromBytes(std::string(n, 'k'));
    ASSERT_FALSE(key.ok()) << n;
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(key.status().message(), HasSubstr("must have 32 bytes, got"));
  }
  auto a = DatagramKey::Random();
  auto b = DatagramKey::Random();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bytes().size(), kDatagramKeyBytes);
  EXPECT_NE(a->bytes(), b->bytes());
  // bytes() hands out the key that makes the same MACs on the other side.
  auto copy = DatagramKey::FromBytes(a->bytes());
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->Mac(TestNonce(), "x"), a->Mac(TestNonce(), "x"));
  EXPECT_EQ(AsString(a->Mac(TestNonce(), "x")), ReferenceMac(a->bytes(), TestNonce(), "x"));
}

TEST(UdpFrameTest, KeyCopiesAndMovesStayUsable) {
  DatagramKey key = TestKey();
  DatagramKey copy = key;
  DatagramKey moved = std::move(key);
  EXPECT_EQ(copy.bytes(), KeyBytes());
  EXPECT_EQ(moved.bytes(), KeyBytes());
  // A moved-from key is a copy, not an empty shell (the class has no separate move).
  EXPECT_EQ(key.bytes(), KeyBytes());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(AsString(key.Mac(TestNonce(), "abc")), ReferenceMac(KeyBytes(), TestNonce(), "abc"));
  auto other = DatagramKey::Random();
  ASSERT_TRUE(other.ok());
  copy = *other;
  EXPECT_EQ(copy.bytes(), other->bytes());
}

TEST(UdpFrameTest, MacIsThreadSafe) {
  const DatagramKey key = TestKey();
  std::vector<std::string> inputs;
  std::vector<std::string> expected;
  for (size_t i = 0; i < 16; ++i) {
    inputs.push_back(std::string(100 + 97 * i, static_cast<char>(i)));
    expected.push_back(ReferenceMac(KeyBytes(), TestNonce(), inputs.back()));
  }
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        const size_t i = static_cast<size_t>(rep + t) % inputs.size();
        if (!key.Verify(TestNonce(), inputs[i], expected[i])) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(UdpFrameTest, EncodeRefusesBadInput) {
  const DatagramKey key = TestKey();
  std::string out;
  struct Case {
    const char* name;
    DatagramHeader header;
    std::string codec;
    size_t payload_bytes;
    const char* message;
  };
  DatagramHeader zero_count = GoldenHeader();
  zero_count.chunk_count = 0;
  zero_count.chunk_index = 0;
  DatagramHeader index_at_count = GoldenHeader();
  index_at_count.chunk_index = 3;
  DatagramHeader zero_elems = GoldenHeader();
  zero_elems.chunk_elems = 0;
  const size_t fits = kMaxDatagramBytes - DatagramOverhead(4);
  const Case cases[] = {
      {"empty codec", GoldenHeader(), "", 4, "codec_len 0 is outside [1, 64]"},
      {"long codec", GoldenHeader(), std::string(65, 'a'), 4, "codec_len 65 is outside"},
      {"codec char", GoldenHeader(), "fp32;", 4, "codec byte 4 (0x3b)"},
      {"codec nul", GoldenHeader(), std::string("fp\0", 3), 4, "codec byte 2 (0x00)"},
      {"chunk_count 0", zero_count, "fp32", 4, "chunk_count is 0"},
      {"chunk_index", index_at_count, "fp32", 4, "chunk_index 3 is not below chunk_count 3"},
      {"chunk_elems 0", zero_elems, "fp32", 4, "chunk_elems is 0"},
      {"too large", GoldenHeader(), "fp32", fits + 1,
       "65432 payload bytes with 76 bytes of header, codec and MAC exceed 65507 bytes"},
  };
  for (const Case& c : cases) {
    absl::Status s =
        EncodeDatagram(c.header, c.codec, std::string(c.payload_bytes, 'p'), key, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
  }
  EXPECT_TRUE(EncodeDatagram(GoldenHeader(), "fp32", std::string(fits, 'p'), key, &out).ok());
}

TEST(UdpFrameTest, ChunkCountRoundsUp) {
  EXPECT_EQ(ChunkCount(0, 5), 0u);
  EXPECT_EQ(ChunkCount(1, 5), 1u);
  EXPECT_EQ(ChunkCount(10, 5), 2u);
  EXPECT_EQ(ChunkCount(11, 5), 3u);
  EXPECT_EQ(ChunkCount(10, 1), 10u);
  EXPECT_EQ(ChunkCount(0xffffffffu, 1), 0xffffffffu);  // no overflow in numel + E - 1
  EXPECT_EQ(ChunkCount(0xffffffffu, 0x80000000u), 2u);
  EXPECT_EQ(ChunkCount(7, 0), 0u);
}

TEST(UdpFrameTest, ChunkRangesTileTheSliceWithAPartialLastChunk) {
  EXPECT_EQ(ChunkRangeOf(11, 5, 0), (ChunkRange{0, 5}));
  EXPECT_EQ(ChunkRangeOf(11, 5, 1), (ChunkRange{5, 5}));
  EXPECT_EQ(ChunkRangeOf(11, 5, 2), (ChunkRange{10, 1}));
  EXPECT_EQ(ChunkRangeOf(11, 5, 3), (ChunkRange{11, 0}));
  EXPECT_EQ(ChunkRangeOf(10, 5, 1), (ChunkRange{5, 5}));  // exactly divisible: full last chunk
  EXPECT_EQ(ChunkRangeOf(10, 5, 2), (ChunkRange{10, 0}));
  EXPECT_EQ(ChunkRangeOf(3, 100, 0), (ChunkRange{0, 3}));
  EXPECT_EQ(ChunkRangeOf(7, 0, 0), (ChunkRange{0, 0}));
  // index * E beyond 32 bits must not wrap back into the slice.
  EXPECT_EQ(ChunkRangeOf(100, 0x10000, 0x10000), (ChunkRange{100, 0}));
  EXPECT_EQ(ChunkRangeOf(0xffffffffu, 0x80000000u, 1), (ChunkRange{0x80000000u, 0x7fffffffu}));

  for (uint32_t numel : {1u, 2u, 63u, 64u, 65u, 1000u, 65536u}) {
    for (uint32_t elems : {1u, 3u, 64u, 256u, 70000u}) {
      const uint32_t count = ChunkCount(numel, elems);
      uint32_t next = 0;
      for (uint32_t i = 0; i < count; ++i) {
        const ChunkRange r = ChunkRangeOf(numel, elems, i);
        EXPECT_EQ(r.first, next);
        EXPECT_GE(r.count, 1u);
        EXPECT_LE(r.count, elems);
        next = r.first + r.count;
      }
      EXPECT_EQ(next, numel) << numel << " " << elems;
    }
  }
}

// A chunk of ChunkElemsForMtu fp32 values, with its codec spec and a head of
// kChunkCodecHeadBytes, fits in one packet of that MTU, and one value more would not
// (unless capped by the largest datagram or raised to 1).
TEST(UdpFrameTest, ChunkElemsForMtuFillsOnePacket) {
  struct Case {
    size_t mtu;
    bool ipv6;
    size_t codec_bytes;
  };
  for (const Case& c : {Case{1500, false, 4}, Case{1500, false, 64}, Case{9000, false, 4},
                        Case{1280, true, 4}, Case{576, false, 20}, Case{65536, true, 4}}) {
    const uint32_t n = ChunkElemsForMtu(c.mtu, c.ipv6, c.codec_bytes);
    const size_t packet = c.mtu - (c.ipv6 ? 40 : 20) - 8;
    const size_t datagram = DatagramOverhead(c.codec_bytes) + kChunkCodecHeadBytes + 4 * n;
    EXPECT_LE(datagram, packet) << c.mtu;
    EXPECT_GT(datagram + 4, packet) << c.mtu;
  }
  EXPECT_EQ(ChunkElemsForMtu(1500, false, 4), 345u);
  // Loopback's 65,536 is capped by the largest IPv4 datagram.
  const uint32_t lo = ChunkElemsForMtu(65536, false, 4);
  EXPECT_EQ(lo, 16353u);
  EXPECT_LE(DatagramOverhead(4) + kChunkCodecHeadBytes + 4 * size_t{lo}, kMaxDatagramBytes);
  EXPECT_EQ(ChunkElemsForMtu(100, false, 64), 1u);
  EXPECT_EQ(ChunkElemsForMtu(0, true, 4), 1u);
}

TEST(UdpFrameTest, CheckChunkGeometryAcceptsEveryChunkOfTheSlice) {
  DatagramHeader h;
  h.chunk_elems = 256;
  h.chunk_count = 4;  // 1000 = 3 * 256 + 232
  for (uint16_t i = 0; i < 4; ++i) {
    h.chunk_index = i;
    EXPECT_TRUE(CheckChunkGeometry(h, 1000).ok()) << i;
  }
  h.chunk_count = 4;
  h.chunk_index = 3;
  EXPECT_TRUE(CheckChunkGeometry(h, 1024).ok());  // exactly divisible
  h.chunk_elems = 1;
  h.chunk_count = 0xffff;
  h.chunk_index = 0xfffe;
  EXPECT_TRUE(CheckChunkGeometry(h, 0xffff).ok());  // the most chunks that fit
}

TEST(UdpFrameTest, CheckChunkGeometryRefusesMismatches) {
  struct Case {
    const char* name;
    uint32_t elems;
    uint16_t index;
    uint16_t count;
    uint32_t numel;
    const char* message;
  };
  const Case cases[] = {
      {"elems 0", 0, 0, 1, 10, "chunk_elems is 0"},
      {"count low", 256, 0, 3, 1000,
       "chunk_count 3, but a slice of 1000 coordinates in chunks of 256 has 4"},
      {"count high", 256, 0, 5, 1024, "chunk_count 5, but a slice of 1024"},
      {"empty slice", 1, 0, 1, 0, "chunk_count 1, but a slice of 0 coordinates"},
      {"index", 256, 4, 4, 1000, "chunk_index 4 is not below chunk_count 4"},
      {"count overflows 16 bits", 1, 0, 0xffff, 0x10000,
       "a slice of 65536 coordinates in chunks of 1 needs 65536 chunks; at most 65535"},
      {"count wraps to a match", 1, 0, 0, 0x10000, "needs 65536 chunks"},
  };
  for (const Case& c : cases) {
    DatagramHeader h;
    h.chunk_elems = c.elems;
    h.chunk_index = c.index;
    h.chunk_count = c.count;
    absl::Status s = CheckChunkGeometry(h, c.numel);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
  }
}

// Not a benchmark (there is no bench target for core); prints the MAC rate next to memcpy
// so a regression to a slow path (re-keying per message) shows in the test log.
TEST(UdpFrameTest, ReportsMacThroughput) {
  const DatagramKey key = TestKey();
  const std::string data(32 * 1024, 'g');
  std::string sink(data.size(), '\0');
  using Clock = std::chrono::steady_clock;
  auto rate = [&](auto&& f) {
    const int iters = 200;
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(data.size()) * iters / s / 1e6;
  };
  uint8_t x = 0;
  const std::string nonce = TestNonce();
  const double mac_mbs = rate([&] { x ^= key.Mac(nonce, data)[0]; });
  const double copy_mbs = rate([&] {
    std::memcpy(sink.data(), data.data(), data.size());
    x ^= static_cast<uint8_t>(sink[x % sink.size()]);
  });
  std::printf("Mac() on 32 KiB: %.0f MB/s; memcpy: %.0f MB/s (%u)\n", mac_mbs, copy_mbs, x);
  EXPECT_GT(mac_mbs, 0.0);
}

}  // namespace
}  // namespace ps::net
