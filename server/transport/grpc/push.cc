#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/data_plane.h"
#include "core/status.h"
#include "net/grpc_bytes.h"
#include "net/grpc_status.h"
#include "net/wire.h"
#include "server/transport/grpc/data_methods.h"

namespace ps::server::transport::grpc {

void DataMethods::AddTo(GrpcFront* front) {
  // A shard on another data plane refuses gRPC data from the method's name, before a
  // body is read: the worker joined with an older library or asked for gRPC past the
  // Join check (docs/data-plane.md, "Workers and shards on different data planes").
  auto other_plane = [this](std::string_view method) {
    return [this, method](const Caller& caller) -> absl::Status {
      if (gate_.front->plane() == core::DataPlane::kGrpc) return absl::OkStatus();
      return gate_.front->RefusePlane(absl::StrCat(caller.Name(), " calls ", core::AsAbsl(method), " on"),
                                      core::DataPlaneName(core::DataPlane::kGrpc));
    };
  };
  FrontMethod push;
  push.unary = [this](FrontCall* c, const ::grpc::ByteBuffer& r) { Push(c, r); };
  push.refuse_unread = other_plane("Push");
  front->Add("/ps.v1.WorkerService/Push", std::move(push));
  FrontMethod pull;
  pull.stream = [this](FrontCall* c, const ::grpc::ByteBuffer& r) { return Pull(c, r); };
  pull.refuse_unread = other_plane("Pull");
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
                                   .loss = frame->loss,
                                   .lr = frame->lr},
                          frame->payload.parts());
  } else {
    s = peer.status();
  }
  // PushResponse has no fields.
  gate_.Answer(call, s, request_bytes,
               s.ok() ? net::HeaderAndBody({}, nullptr) : ::grpc::ByteBuffer());
}

}  // namespace ps::server::transport::grpc
