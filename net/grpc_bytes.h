// gRPC's byte buffers on the zero-copy message paths (docs/data_path.md): a message
// sent as a small header followed by a buffer of ours that gRPC references instead of
// copying, and a received message's bytes seen in place, as the pieces net/wire.h
// parses. For the worker library and the shards; not a public header.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "net/wire.h"

namespace ps::net {

// `header` (copied) followed by `body`'s bytes (not copied: the buffer keeps `body`
// alive until gRPC no longer needs its bytes).
grpc::ByteBuffer HeaderAndBody(std::string_view header, std::shared_ptr<const std::string> body);

// A received message's bytes, in place: holds references to gRPC's slices.
class ReceivedBytes {
 public:
  // INTERNAL when gRPC cannot list the buffer's slices (a compressed message).
  absl::Status Take(const grpc::ByteBuffer& buffer);
  Pieces pieces() const { return views_; }

 private:
  std::vector<grpc::Slice> slices_;
  std::vector<std::string_view> views_;
};

// A message of a generated type from a received buffer (requests on the raw methods);
// INVALID_ARGUMENT "malformed <Type>" when it does not parse.
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);

// A generated message as a buffer to send.
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);

}  // namespace ps::net
