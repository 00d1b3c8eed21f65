#include <memory>
#include <string>
#include <utility>

#include "net/grpc_bytes.h"
#include "net/grpc_status.h"
#include "net/wire.h"
#include "server/transport/grpc/data_methods.h"

namespace ps::server::transport::grpc {
namespace {

// One Pull as a gRPC stream, the backend's PullSink: the front's PullHandle picks the
// slices and their order; this writes each as a PullResponse (header, then the shared
// body) and ends the call.
class PullStream final : public StreamHandler, private PullSink {
 public:
  PullStream(FrontCall* call, std::unique_ptr<PullHandle> pull)
      : call_(call), pull_(std::move(pull)) {}

  void Start() override { pull_->Start(this); }

  void OnWriteDone(bool ok) override {
    response_.Clear();  // drops this stream's reference to the snapshot
    pull_->WriteDone(ok);
  }

  void OnCancel() override { pull_->Cancel(); }

 private:
  // PullSink (called with the scheduler's lock held, one write at a time).
  void Write(PullItem item) override {
    const size_t bytes = item.body->size();
    response_ =
        net::HeaderAndBody(net::PullResponseHeader(item.header, bytes), std::move(item.body));
    call_->Write(&response_);
  }
  void Finish(const absl::Status& status) override { call_->Finish(net::ToGrpc(status)); }

  FrontCall* const call_;
  ::grpc::ByteBuffer response_;       // the message being written
  std::unique_ptr<PullHandle> pull_;  // last: destroyed first, detaching this sink
};

}  // namespace

std::unique_ptr<StreamHandler> DataMethods::Pull(FrontCall* call, const ::grpc::ByteBuffer& raw) {
  const size_t request_bytes = raw.Length();
  // A worker pulls each slice of this shard at most once: a longer list is refused where
  // its first extra id is read, so a request naming millions of ids costs what was read
  // of it (the whole list before this shard has a layout, bounded by the layout limit).
  net::ReceivedBytes bytes;
  absl::Status taken = bytes.Take(raw);
  absl::StatusOr<net::PullRequestFrame> req =
      taken.ok() ? net::ParsePullRequest(bytes.pieces(), gate_.shard->MaxPullSlices())
                 : absl::StatusOr<net::PullRequestFrame>(taken);
  if (!req.ok()) {
    gate_.Answer(call, gate_.shard->Refuse(Refusal::kMalformed, req.status().message()),
                 request_bytes);
    return nullptr;
  }
  std::string session_bytes;
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req->session.Contiguous(&session_bytes));
  if (!peer.ok()) {
    gate_.Answer(call, peer.status(), request_bytes);
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<PullHandle>> pull =
      gate_.front->OpenPull(*peer, PullAsk{.layout_hash = req->layout_hash,
                                           .min_version = req->min_version,
                                           .held_epoch = req->held_epoch,
                                           .slice_ids = std::move(req->slice_ids),
                                           .held_versions = std::move(req->held_versions)});
  if (!pull.ok()) {
    gate_.Answer(call, pull.status(), request_bytes);
    return nullptr;
  }
  return std::make_unique<PullStream>(call, *std::move(pull));
}

}  // namespace ps::server::transport::grpc
