#include "net/grpc_bytes.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::net {
namespace {

void ReleaseBody(void* holder) { delete static_cast<std::shared_ptr<const std::string>*>(holder); }

}  // namespace

grpc::ByteBuffer HeaderAndBody(std::string_view header, std::shared_ptr<const std::string> body) {
  grpc::Slice slices[2];
  size_t n = 0;
  if (!header.empty()) slices[n++] = grpc::Slice(header.data(), header.size());
  if (body != nullptr && !body->empty()) {
    // gRPC never writes to a slice it sends; the const_cast only fits its signature.
    void* data = const_cast<char*>(body->data());
    const size_t size = body->size();
    slices[n++] = grpc::Slice(data, size, &ReleaseBody,
                              new std::shared_ptr<const std::string>(std::move(body)));
  }
  return grpc::ByteBuffer(slices, n);
}

absl::Status ReceivedBytes::Take(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  views_.clear();
  const grpc::Status s = buffer.Dump(&slices_);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("reading a received message: ", s.error_message()));
  }
  views_.reserve(slices_.size());
  for (const grpc::Slice& slice : slices_) {
    views_.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return absl::OkStatus();
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  ReceivedBytes bytes;
  if (absl::Status s = bytes.Take(buffer); !s.ok()) return s;
  ByteRange all;
  for (std::string_view piece : bytes.pieces()) all.Append(piece);
  std::string scratch;
  const std::string_view data = all.Contiguous(&scratch);
  if (!message->ParseFromArray(data.data(), static_cast<int>(data.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message) {
  auto bytes = std::make_shared<std::string>();
  message.SerializeToString(bytes.get());
  return HeaderAndBody({}, std::move(bytes));
}

}  // namespace ps::net
