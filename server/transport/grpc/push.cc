#include <string>
#include <string_view>

#include "net/grpc_bytes.h"
#include "net/grpc_status.h"
#include "net/wire.h"
#include "server/transport/grpc/data_methods.h"

namespace ps::server::transport::grpc {

void DataMethods::AddTo(GrpcFront* front) {
  FrontMethod push;
  push.unary = [this](FrontCall* c, const ::grpc::ByteBuffer& r) { Push(c, r); };
  front->Add("/ps.v1.WorkerService/Push", std::move(push));
  FrontMethod pull;
  pull.stream = [this](FrontCall* c, const ::grpc::ByteBuffer& r) { return Pull(c, r); };
  front->Add("/ps.v1.WorkerService/Pull", std::move(pull));
}

void DataMethods::Push(FrontCall* call, const ::grpc::ByteBuffer& req) {
  const size_t request_bytes = req.Length();
  net::ReceivedBytes bytes;
  absl::Status s = bytes.Take(req);
  absl::StatusOr<net::PushFrame> frame =
      s.ok() ? net::ParsePushRequest(bytes.pieces()) : absl::StatusOr<net::PushFrame>(s);
  if (!frame.ok()) {
    return gate_.Answer(call, gate_.shard->Refuse(Refusal::kMalformed, frame.status().message()),
                        request_bytes);
  }
  // The payload is decoded straight from gRPC's buffers (Codec::DecodePieces).
  std::string session_bytes, codec_bytes;
  absl::StatusOr<DataPeer> peer =
      gate_.AdmitWorker(*call, frame->session.Contiguous(&session_bytes));
  if (peer.ok()) {
    s = gate_.front->Push(*peer,
                          PushHead{.layout_hash = frame->layout_hash,
                                   .round = frame->round,
                                   .slice_id = frame->slice_id,
                                   .codec = frame->codec.Contiguous(&codec_bytes),
                                   .loss = frame->loss},
                          frame->payload.parts());
  } else {
    s = peer.status();
  }
  // PushResponse has no fields.
  gate_.Answer(call, s, request_bytes,
               s.ok() ? net::HeaderAndBody({}, nullptr) : ::grpc::ByteBuffer());
}

}  // namespace ps::server::transport::grpc
