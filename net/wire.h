// The two messages that carry tensor bytes, ps.v1.PushRequest and ps.v1.PullResponse,
// read and written in protobuf's wire format without protobuf's copies
// (docs/data_path.md). gRPC hands a received message over as a list of buffers (its
// slices); the readers here parse the fields across those pieces and leave the tensor
// bytes where they are, as a ByteRange, which the caller copies once, straight to where
// the values belong. The writers produce everything before the tensor bytes (a header),
// so the sender can hand gRPC the header and its own buffer of tensor bytes, without
// copying them into a message.
//
// The format is the one `protoc` defines for proto/ps/v1/ps.proto: a message written
// here parses with the generated classes, and a generated message's bytes parse here
// into the same fields. Like protobuf, the readers skip unknown fields, keep the last
// of a repeated scalar field, and truncate a uint32 varint to its low 32 bits. Unlike
// protobuf they refuse the deprecated group wire types (no ps message has groups).
//
// Ownership: ByteRange and the parsed frames borrow the pieces they were parsed from.
// Thread safety: the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "net/slice_fields.h"

namespace ps::net {

// One message's bytes as consecutive pieces (gRPC's slices, or one string).
using Pieces = std::span<const std::string_view>;

// A length-delimited field's bytes, in the pieces they arrived in.
class ByteRange {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The parts, in order; none is empty.
  std::span<const std::string_view> parts() const { return parts_; }
  // Copies the size() bytes to dst.
  void CopyTo(char* dst) const;
  std::string ToString() const;
  // The bytes as one view: the range itself when it is one part, else a copy gathered
  // into `scratch`.
  std::string_view Contiguous(std::string* scratch) const;

  void Append(std::string_view part);

 private:
  absl::InlinedVector<std::string_view, 4> parts_;
  size_t size_ = 0;
};

// ps.v1.PullResponse.
struct PullFrame : SliceFields {
  ByteRange values;  // little-endian fp32, or the delta's payload when codec is set
  ByteRange codec;   // empty: dense values
};

// ps.v1.PushRequest.
struct PushFrame {
  ByteRange session;
  uint64_t layout_hash = 0;
  uint64_t round = 0;
  uint32_t slice_id = 0;
  ByteRange codec;
  ByteRange payload;
  std::optional<float> loss;  // the worker's training loss (local-update training)
  std::optional<float> lr;    // the learning rate it asks the round's step to take
};

// ps.v1.PullRequest, its repeated fields decoded (packed or not, as protobuf accepts).
struct PullRequestFrame {
  ByteRange session;
  uint64_t layout_hash = 0;
  std::vector<uint32_t> slice_ids;
  uint64_t min_version = 0;
  std::vector<uint64_t> held_versions;
  uint64_t held_epoch = 0;
};

// INVALID_ARGUMENT naming the message and what is wrong when `pieces` are not a
// well-formed message of that type.
absl::StatusOr<PullFrame> ParsePullResponse(Pieces pieces);
absl::StatusOr<PushFrame> ParsePushRequest(Pieces pieces);
// The same for a PullRequest, which may name at most `max_slices` slice ids and as many
// held versions: the entry after that is refused (INVALID_ARGUMENT, saying so) where it
// is read, before the rest of the message is, so that refusing a request costs what was
// read of it, not what it names.
absl::StatusOr<PullRequestFrame> ParsePullRequest(Pieces pieces, size_t max_slices);

// The bytes of the message before its tensor bytes, which follow them to make the
// whole message: values_size bytes of values, payload_size bytes of payload. Slice id
// and version are always written, zeros included, and every field comes before the
// tensor bytes, so a receiver knows the slice before the values arrive; the fields of
// compressed pulls (codec, base version, epoch) and the losses only when set.
std::string PullResponseHeader(const PullHeader& header, size_t values_size);
std::string PushRequestHeader(std::string_view session, uint64_t layout_hash, uint64_t round,
                              uint32_t slice_id, std::string_view codec, size_t payload_size,
                              std::optional<float> loss = std::nullopt,
                              std::optional<float> lr = std::nullopt);

}  // namespace ps::net
