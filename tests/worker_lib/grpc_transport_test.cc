// The gRPC transport against a stand-in shard on loopback (a generic gRPC service that
// records what it gets and answers scripted bytes): pushes go out as ps.v1.PushRequest
// bytes, pulled messages are read in place, and a message that is not a PullResponse
// ends the stream with INVALID_ARGUMENT naming it.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "net/wire.h"
#include "ps/v1/ps.pb.h"
#include "worker_lib/grpc_transport_internal.h"

namespace ps::internal {
namespace {

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s.data(), s.size());
  return grpc::ByteBuffer(&slice, 1);
}

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Reads one request, then writes `answers` in order and finishes OK.
class Scripted final : public grpc::ServerGenericBidiReactor {
 public:
  Scripted(std::vector<std::string> answers, std::function<void(std::string)> record)
      : answers_(std::move(answers)), record_(std::move(record)) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::INTERNAL, "no request"));
    record_(Flatten(request_));
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (next_ == answers_.size()) return Finish(grpc::Status::OK);
    out_ = Bytes(answers_[next_++]);
    StartWrite(&out_);
  }
  std::vector<std::string> answers_;
  std::function<void(std::string)> record_;
  grpc::ByteBuffer request_, out_;
  size_t next_ = 0;
};

class StandInShard final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    const std::string method = ctx->method();
    std::vector<std::string> answers;
    if (method == "/ps.v1.WorkerService/Push") answers.push_back("");  // an empty PushResponse
    if (method == "/ps.v1.WorkerService/Pull") answers = pull_answers;
    return new Scripted(std::move(answers), [this, method](std::string request) {
      absl::MutexLock lock(&mu);
      requests.emplace_back(method, std::move(request));
    });
  }

  std::vector<std::string> pull_answers;
  absl::Mutex mu;
  std::vector<std::pair<std::string, std::string>> requests ABSL_GUARDED_BY(mu);
};

class GrpcTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // port 0 never shared
    builder.RegisterCallbackGenericService(&shard_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    WorkerOptions options;
    options.shard_addresses = {"127.0.0.1:" + std::to_string(port)};
    auto transports = ConnectGrpcShards(options);
    ASSERT_TRUE(transports.ok()) << transports.status();
    transport_ = std::move((*transports)[0]);
  }
  void TearDown() override {
    transport_.reset();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  StandInShard shard_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ShardTransport> transport_;
};

TEST_F(GrpcTransportTest, APushGoesOutAsPushRequestBytes) {
  ShardTransport::PushMessage message;
  message.fields.set_session("token");
  message.fields.set_layout_hash(0xabcdef);
  message.fields.set_round(4);
  message.fields.set_slice_id(2);
  message.fields.set_codec("fp16");
  message.payload = std::make_shared<const std::string>(std::string(100000, '\x05'));
  auto call = transport_->NewPush(RpcClock::now() + std::chrono::seconds(10));
  absl::Notification done;
  absl::Status status;
  call->Start(&message, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&shard_.mu);
  ASSERT_EQ(shard_.requests.size(), 1u);
  EXPECT_EQ(shard_.requests[0].first, "/ps.v1.WorkerService/Push");
  v1::PushRequest got;
  ASSERT_TRUE(got.ParseFromString(shard_.requests[0].second));
  EXPECT_EQ(got.session(), "token");
  EXPECT_EQ(got.layout_hash(), 0xabcdefu);
  EXPECT_EQ(got.round(), 4u);
  EXPECT_EQ(got.slice_id(), 2u);
  EXPECT_EQ(got.codec(), "fp16");
  EXPECT_EQ(got.payload(), *message.payload);
}

TEST_F(GrpcTransportTest, PulledSlicesAreReadInPlaceAndAMalformedOneEndsTheStream) {
  v1::PullResponse good;
  good.set_slice_id(3);
  good.set_version(9);
  good.set_values(std::string(200000, '\x11'));  // spans several of gRPC's buffers
  shard_.pull_answers = {good.SerializeAsString(), std::string("\x1a\x05"
                                                               "ab",
                                                               4)};
  v1::PullRequest req;
  req.set_session("token");
  req.add_slice_ids(3);
  req.set_min_version(9);
  std::vector<std::string> received;
  absl::Notification done;
  absl::Status status;
  transport_->Pull(
      req, RpcClock::now() + std::chrono::seconds(10),
      [&](const net::PullFrame& f) {
        EXPECT_EQ(f.slice_id, 3u);
        EXPECT_EQ(f.version, 9u);
        received.push_back(f.values.ToString());
        return true;
      },
      [&](absl::Status s) {
        status = std::move(s);
        done.Notify();
      });
  done.WaitForNotification();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0], good.values());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("malformed PullResponse: field 3 is truncated"),
            absl::string_view::npos)
      << status;
  absl::MutexLock lock(&shard_.mu);
  ASSERT_EQ(shard_.requests.size(), 1u);
  v1::PullRequest sent;
  ASSERT_TRUE(sent.ParseFromString(shard_.requests[0].second));
  EXPECT_EQ(sent.min_version(), 9u);
  EXPECT_EQ(sent.slice_ids_size(), 1);
}

}  // namespace
}  // namespace ps::internal
