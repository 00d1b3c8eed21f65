// What the data frame tests share (data_frame_test.cc, data_frame_refusal_test.cc):
// byte strings, a frame's header and meta bytes, a header patched in place, the refusal
// checks, two-entry PUSHES and SLICES metas and the limits the checks run under.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "net/data_frame.h"

namespace ps::net {

using ::testing::HasSubstr;

inline std::string Bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

// N bytes counting up from `first`.
template <size_t N>
std::array<char, N> Counting(int first) {
  std::array<char, N> out;
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<char>(first + static_cast<int>(i));
  return out;
}

inline std::span<const char, kFrameHeaderBytes> HeaderOf(std::string_view frame) {
  return std::span<const char, kFrameHeaderBytes>(frame.data(), kFrameHeaderBytes);
}

// The meta bytes of a frame written by an Append* function (after its header). A copy:
// what is parsed from it borrows it, so keep it while the parsed meta is used.
inline std::string MetaOf(std::string_view frame) {
  auto h = ParseHeader(HeaderOf(frame));
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return "";
  return std::string(frame.substr(kFrameHeaderBytes, h->meta_bytes));
}

// The header of `frame` with one field changed, as 16 bytes.
inline std::string Patched(std::string frame, size_t offset, std::initializer_list<uint8_t> bytes) {
  frame.resize(kFrameHeaderBytes);
  size_t i = offset;
  for (uint8_t b : bytes) frame[i++] = static_cast<char>(b);
  return frame;
}

inline void ExpectRefused(const absl::Status& s, std::string_view message,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(message)));
}

// A body over the receiver's bound is RESOURCE_EXHAUSTED, as gRPC answers a message over
// its limit.
inline void ExpectOverLimit(const absl::Status& s, std::string_view message) {
  ExpectRefused(s, message, absl::StatusCode::kResourceExhausted);
}

// A PUSHES of two pushes (tags 1 and 2) of 8 and 4 bytes.
inline PushesMeta TwoPushes() {
  PushesMeta m{.layout_hash = 7, .round = 3, .codec = "fp32", .count = 2};
  m.entries[0] = {.tag = 1, .slice_id = 4, .body_bytes = 8};
  m.entries[1] = {.tag = 2, .slice_id = 5, .body_bytes = 4};
  return m;
}

// A SLICES of two slices of 8 and 4 bytes, the second with a loss and queued.
inline SlicesMeta TwoSlices() {
  SlicesMeta m{.codec = "", .count = 2};
  m.entries[0] = {{.slice_id = 4, .version = 9, .epoch = 1}, 8};
  m.entries[1] = {{.slice_id = 5, .version = 9, .epoch = 1, .loss = 0.5f, .queued = true}, 4};
  return m;
}

inline constexpr FrameLimits kLimits{.max_body_bytes = 1 << 20, .max_pull_slices = 64};

}  // namespace ps::net
