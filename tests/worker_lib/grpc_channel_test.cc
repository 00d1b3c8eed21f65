// The gRPC data channel against a stand-in shard on loopback (a generic gRPC service
// that records what it gets and answers scripted bytes): pushes go out as
// ps.v1.PushRequest bytes under the route's session, one call each also when several
// start at once, pulled messages are read in place into the sink's places, and a
// message that is not a PullResponse ends the stream with INVALID_ARGUMENT naming it.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "net/wire.h"
#include "ps/v1/ps.pb.h"
#include "worker_lib/transport/grpc/channel.h"

namespace ps::internal::grpc_plane {
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

// Records what a pull delivers: dense values into its own buffer (as PullStreams places
// them in the caller's), a change where the channel holds it.
class RecordingSink final : public PullSink {
 public:
  absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes) override {
    headers.push_back(h.slice_id);
    placed.resize(bytes);
    return std::span<char>(placed);
  }
  absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes) override {
    EXPECT_EQ(h.version, 9u);
    std::string got;
    for (std::string_view piece : bytes) got.append(piece);
    EXPECT_EQ(got, placed) << "the values were read into the place";
    received.push_back(std::move(got));
    return absl::OkStatus();
  }
  void Done(absl::Status s) override {
    status = std::move(s);
    done.Notify();
  }

  std::vector<uint32_t> headers;
  std::string placed;
  std::vector<std::string> received;
  absl::Status status;
  absl::Notification done;
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
    auto shards = ConnectGrpcShards(options);
    ASSERT_TRUE(shards.ok()) << shards.status();
    ASSERT_EQ(shards->size(), 1u);
    control_ = std::move((*shards)[0].control);
    data_ = std::move((*shards)[0].data);
    DataRoute route;
    route.session = "token";
    route.epoch = 3;
    ASSERT_TRUE(data_->SetRoute(route).ok());
  }
  void TearDown() override {
    data_.reset();
    control_.reset();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  StandInShard shard_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ShardControl> control_;
  std::unique_ptr<DataChannel> data_;
};

TEST_F(GrpcTransportTest, APushGoesOutAsPushRequestBytes) {
  OutgoingPush message;
  message.layout_hash = 0xabcdef;
  message.round = 4;
  message.slice_id = 2;
  message.codec = "fp16";
  message.payload = std::make_shared<const std::string>(std::string(100000, '\x05'));
  auto call = data_->NewPush({&message}, RpcClock::now() + std::chrono::seconds(10));
  EXPECT_EQ(call->epoch(), 3u);
  absl::Notification done;
  absl::Status status;
  call->Start([&](size_t i, absl::Status s) {
    EXPECT_EQ(i, 0u);
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

// A borrowed push (PushOptions::borrow) goes out with the caller's bytes after the
// payload, copied as the call starts: gRPC never holds the caller's buffer (nor the
// push's guard), since it may keep a message queued behind a shard that stopped reading.
TEST_F(GrpcTransportTest, ABorrowedPushIsCopiedAsItStartsAndGrpcNeverHoldsTheCallersBytes) {
  std::string values(100000, '\x07');
  auto guard = std::make_shared<int>(0);
  OutgoingPush message;
  message.layout_hash = 1;
  message.round = 4;
  message.slice_id = 2;
  message.codec = "fp32";
  message.payload = std::make_shared<const std::string>("\x01");
  message.borrowed = std::span<const char>(values.data(), values.size());
  message.borrowed_guard = guard;
  const long own = guard.use_count();
  auto call = data_->NewPush({&message}, RpcClock::now() + std::chrono::seconds(10));
  absl::Notification done;
  absl::Status status;
  call->Start([&](size_t, absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  EXPECT_EQ(guard.use_count(), own);  // nothing of gRPC's took the guard
  values.assign(values.size(), '\x09');  // what the request carries was copied already
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&shard_.mu);
  ASSERT_EQ(shard_.requests.size(), 1u);
  v1::PushRequest got;
  ASSERT_TRUE(got.ParseFromString(shard_.requests[0].second));
  EXPECT_EQ(got.payload(), "\x01" + std::string(100000, '\x07'));
}

TEST_F(GrpcTransportTest, PulledSlicesAreReadInPlaceAndAMalformedOneEndsTheStream) {
  v1::PullResponse good;
  good.set_slice_id(3);
  good.set_version(9);
  good.set_values(std::string(200000, '\x11'));  // spans several of gRPC's buffers
  shard_.pull_answers = {good.SerializeAsString(), std::string("\x1a\x05"
                                                               "ab",
                                                               4)};
  PullAsk ask;
  ask.slice_ids = {3};
  ask.min_version = 9;
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(data_->Pull(ask, RpcClock::now() + std::chrono::seconds(10), sink), 3u);
  sink->done.WaitForNotification();
  EXPECT_EQ(sink->headers, std::vector<uint32_t>({3}));
  ASSERT_EQ(sink->received.size(), 1u);
  EXPECT_EQ(sink->received[0], good.values());
  EXPECT_EQ(sink->status.code(), absl::StatusCode::kInvalidArgument) << sink->status;
  EXPECT_NE(sink->status.message().find("malformed PullResponse: field 3 is truncated"),
            absl::string_view::npos)
      << sink->status;
  absl::MutexLock lock(&shard_.mu);
  ASSERT_EQ(shard_.requests.size(), 1u);
  v1::PullRequest sent;
  ASSERT_TRUE(sent.ParseFromString(shard_.requests[0].second));
  EXPECT_EQ(sent.session(), "token");
  EXPECT_EQ(sent.min_version(), 9u);
  EXPECT_EQ(sent.slice_ids_size(), 1);
}

TEST_F(GrpcTransportTest, PushesStartedTogetherAreAnsweredEach) {
  std::vector<OutgoingPush> pushes(3);
  std::vector<const OutgoingPush*> ptrs;
  for (uint32_t i = 0; i < pushes.size(); ++i) {
    pushes[i].round = 1;
    pushes[i].slice_id = i;
    pushes[i].codec = "fp32";
    pushes[i].loss = 0.5f;
    pushes[i].payload = std::make_shared<const std::string>(std::string(16, 'a' + i));
    ptrs.push_back(&pushes[i]);
  }
  auto call = data_->NewPush(ptrs, RpcClock::now() + std::chrono::seconds(10));
  absl::Mutex mu;
  std::vector<int> answered(pushes.size(), 0);
  call->Start([&](size_t i, absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    absl::MutexLock lock(&mu);
    ++answered[i];
  });
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (int n : answered) {
        if (n == 0) return false;
      }
      return true;
    };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(10)));
    EXPECT_EQ(answered, std::vector<int>(pushes.size(), 1));
  }
  absl::MutexLock lock(&shard_.mu);
  ASSERT_EQ(shard_.requests.size(), pushes.size());
  std::set<uint32_t> slices;
  for (const auto& [method, bytes] : shard_.requests) {
    EXPECT_EQ(method, "/ps.v1.WorkerService/Push");
    v1::PushRequest got;
    ASSERT_TRUE(got.ParseFromString(bytes));
    EXPECT_EQ(got.session(), "token");
    EXPECT_EQ(got.loss(), 0.5f);
    EXPECT_EQ(got.payload(), *pushes[got.slice_id()].payload);
    slices.insert(got.slice_id());
  }
  EXPECT_EQ(slices, (std::set<uint32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace ps::internal::grpc_plane
