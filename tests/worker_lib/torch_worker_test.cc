// The libtorch adapter against a real in-process shard on loopback (one worker, SGD
// with lr 1 and no momentum, so version 1 = initial - gradient): the pull lands in the
// parameters module by module, the gradients leave from autograd's hooks during
// backward, and hook errors come out of FinishStep().
#include "worker_lib/torch/torch_worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/server.h"

namespace ps::worker_torch {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr milliseconds kTimeout{20000};

// fc1 (8 -> 16) relu fc2 (16 -> 4), and a layer the forward pass never uses.
// (named_parameters() lists a module's own parameters before its children's: the
// layers are children, so the order is fc1, fc2, spare.)
struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    spare = register_module("spare", torch::nn::Linear(2, 3));
  }
  // `before` runs with each layer right before it, as a model's forward pre-hook.
  torch::Tensor Forward(const torch::Tensor& x, const std::function<void(torch::nn::Module&)>& before,
                        torch::Tensor* hidden = nullptr) {
    if (before) before(*fc1);
    torch::Tensor z = fc1(x);
    if (hidden != nullptr) *hidden = z;
    torch::Tensor h = torch::relu(z);
    if (before) before(*fc2);
    return fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, spare{nullptr};
};

// A copy of `net`'s parameter values in a fresh Net.
std::shared_ptr<Net> CopyOf(Net& net) {
  auto copy = std::make_shared<Net>();
  torch::NoGradGuard no_grad;
  auto src = net.parameters();
  auto dst = copy->parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  return copy;
}

class TorchWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ServerOptions o;
    o.insecure = true;
    o.host = "127.0.0.1";
    o.port = 0;
    o.num_workers = 1;
    o.learning_rate = 1.0f;
    o.momentum = 0.0f;
    o.threads = 1;
    o.round_deadline = milliseconds(20000);
    o.log_level = "warn";
    auto s = server::Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    torch::manual_seed(7);
    net_ = std::make_shared<Net>();
    x_ = torch::randn({5, 8});
    y_ = torch::randn({5, 4});
  }

  WorkerOptions Options() const {
    WorkerOptions o;
    o.shard_addresses = {absl::StrCat("127.0.0.1:", server_->port())};
    o.connect_timeout = kTimeout;
    o.rpc_timeout = kTimeout;
    return o;
  }

  // Small slices: fc1.weight (128 values) spans several.
  static TorchWorkerOptions SmallSlices() {
    TorchWorkerOptions t;
    t.slice_elems = 48;
    return t;
  }

  torch::Tensor Loss(Net& net, const std::function<void(torch::nn::Module&)>& before = nullptr,
                     torch::Tensor* hidden = nullptr) {
    return torch::mse_loss(net.Forward(x_, before, hidden), y_);
  }

  std::unique_ptr<server::Server> server_;
  std::shared_ptr<Net> net_;
  torch::Tensor x_, y_;
};

TEST_F(TorchWorkerTest, OneStepLeavesInitialMinusGradientInEveryParameter) {
  // The expected version 1, by plain autograd on a copy.
  std::shared_ptr<Net> ref = CopyOf(*net_);
  Loss(*ref).backward();
  std::vector<torch::Tensor> expected;
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : ref->parameters()) {
      expected.push_back(p.grad().defined() ? p - p.grad() : p.clone());
    }
  }

  auto tw = TorchWorker::Start(Options(), *net_, SmallSlices());
  ASSERT_TRUE(tw.ok()) << tw.status();
  TorchWorker& w = **tw;
  ASSERT_TRUE(w.StartPull(0, kTimeout).ok());
  auto await = [&](torch::nn::Module& m) { ASSERT_TRUE(w.AwaitModule(m).ok()); };
  torch::Tensor loss = Loss(*net_, await);
  auto version = w.AwaitAll();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 0u);
  ASSERT_TRUE(w.BeginStep(0).ok());
  loss.backward();
  ASSERT_TRUE(w.FinishStep().ok());

  // Version 1, layer by layer: fc1's parameters hold it once AwaitModule(fc1) is OK.
  ASSERT_TRUE(w.StartPull(1, kTimeout).ok());
  ASSERT_TRUE(w.AwaitModule(*net_->fc1).ok());
  EXPECT_TRUE(torch::equal(net_->fc1->weight, expected[0]));
  EXPECT_TRUE(torch::equal(net_->fc1->bias, expected[1]));
  version = w.AwaitAll();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
  const std::vector<torch::Tensor> params = net_->parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], expected[i])) << net_->named_parameters().keys()[i];
  }
  // The unused layer was pushed as zeros by FinishStep: unchanged.
  EXPECT_TRUE(torch::equal(net_->spare->weight, ref->spare->weight));
  EXPECT_TRUE(torch::equal(net_->spare->bias, ref->spare->bias));
  // Each parameter's .grad is filled as without the adapter.
  EXPECT_TRUE(torch::equal(net_->fc2->weight.grad(), ref->fc2->weight.grad()));
  // The adapter's pushes (fp32, the TCP plane) left from its staging buffers.
  const WorkerStats stats = w.worker().stats();
  EXPECT_GT(stats.slices_pushed, 0u);
  EXPECT_EQ(stats.slices_borrowed, stats.slices_pushed);
}

TEST_F(TorchWorkerTest, GradientsArePushedDuringBackwardLastLayerFirst) {
  auto tw = TorchWorker::Start(Options(), *net_, SmallSlices());
  ASSERT_TRUE(tw.ok()) << tw.status();
  TorchWorker& w = **tw;
  const core::ModelLayout& layout = w.worker().layout();
  // Slices of fc2.weight and fc2.bias (tensors 2 and 3).
  const uint64_t fc2_slices = layout.SlicesOfTensor(2).size() + layout.SlicesOfTensor(3).size();
  ASSERT_TRUE(w.StartPull(0, kTimeout).ok());
  torch::Tensor hidden;
  auto await = [&](torch::nn::Module& m) { ASSERT_TRUE(w.AwaitModule(m).ok()); };
  torch::Tensor loss = Loss(*net_, await, &hidden);
  ASSERT_TRUE(w.AwaitAll().ok());
  // fc1's pre-activation gets its gradient after fc2's parameters got theirs and
  // before fc1's: by then the shard must have accepted fc2's slices, and nothing of
  // fc1's may have been pushed yet.
  uint64_t pushed_when_fc1_next = 0;
  bool fc2_accepted_during_backward = false;
  hidden.register_hook([&](torch::Tensor) {
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pushed_when_fc1_next = w.worker().stats().slices_pushed;
      if (pushed_when_fc1_next >= fc2_slices) {
        fc2_accepted_during_backward = true;
        break;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  ASSERT_TRUE(w.BeginStep(0).ok());
  loss.backward();
  EXPECT_TRUE(fc2_accepted_during_backward) << pushed_when_fc1_next << " of " << fc2_slices;
  EXPECT_EQ(pushed_when_fc1_next, fc2_slices);
  ASSERT_TRUE(w.FinishStep().ok());
  EXPECT_EQ(w.worker().stats().slices_pushed, layout.slices().size());
}

TEST_F(TorchWorkerTest, HookErrorsComeOutOfFinishStepNotThroughAutograd) {
  auto tw = TorchWorker::Start(Options(), *net_, SmallSlices());
  ASSERT_TRUE(tw.ok()) << tw.status();
  TorchWorker& w = **tw;
  ASSERT_TRUE(w.StartPull(0, kTimeout).ok());
  torch::Tensor loss = Loss(*net_);
  ASSERT_TRUE(w.AwaitAll().ok());
  ASSERT_TRUE(w.BeginStep(0).ok());
  // NaN gradients: the Worker refuses to encode them, inside the hooks.
  EXPECT_NO_THROW((loss * std::numeric_limits<float>::quiet_NaN()).backward());
  const absl::Status finished = w.FinishStep();
  EXPECT_FALSE(finished.ok());
  EXPECT_THAT(std::string(finished.message()), HasSubstr("fc2"));
}

TEST_F(TorchWorkerTest, SecondBackwardInAStepIsAnErrorAndOutsideAStepPushesNothing) {
  auto tw = TorchWorker::Start(Options(), *net_, SmallSlices());
  ASSERT_TRUE(tw.ok()) << tw.status();
  TorchWorker& w = **tw;
  ASSERT_TRUE(w.StartPull(0, kTimeout).ok());
  ASSERT_TRUE(w.AwaitAll().ok());
  // No step open: backward pushes nothing.
  Loss(*net_).backward();
  ASSERT_TRUE(w.worker().WaitPushes().ok());
  EXPECT_EQ(w.worker().stats().slices_pushed, 0u);
  EXPECT_EQ(w.FinishStep().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(w.BeginStep(0).ok());
  EXPECT_EQ(w.BeginStep(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.StartPull(1, kTimeout).code(), absl::StatusCode::kFailedPrecondition);
  torch::Tensor loss = Loss(*net_);
  loss.backward(/*gradient=*/{}, /*retain_graph=*/true);
  loss.backward();
  const absl::Status finished = w.FinishStep();
  EXPECT_EQ(finished.code(), absl::StatusCode::kFailedPrecondition) << finished;
  EXPECT_THAT(std::string(finished.message()), HasSubstr("second gradient"));
  // The round still closed with the first gradients.
  ASSERT_TRUE(w.StartPull(1, kTimeout).ok());
  auto version = w.AwaitAll();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
}

TEST_F(TorchWorkerTest, AwaitWithoutAPullAndForeignModules) {
  auto tw = TorchWorker::Start(Options(), *net_, SmallSlices());
  ASSERT_TRUE(tw.ok()) << tw.status();
  TorchWorker& w = **tw;
  EXPECT_TRUE(w.AwaitModule(*net_->fc1).ok());
  EXPECT_EQ(w.AwaitAll().status().code(), absl::StatusCode::kFailedPrecondition);
  torch::nn::Linear other(2, 2);
  EXPECT_EQ(w.AwaitModule(*other).code(), absl::StatusCode::kInvalidArgument);
  // The root module, recursively: every parameter.
  ASSERT_TRUE(w.StartPull(0, kTimeout).ok());
  EXPECT_TRUE(w.AwaitModule(*net_, /*recurse=*/true).ok());
}

TEST_F(TorchWorkerTest, PullErrorIsReturnedByAwaitModuleAndAwaitAll) {
  auto tw = TorchWorker::Start(Options(), *net_, SmallSlices());
  ASSERT_TRUE(tw.ok()) << tw.status();
  TorchWorker& w = **tw;
  // Version 5 never comes: the pull times out.
  ASSERT_TRUE(w.StartPull(5, milliseconds(200)).ok());
  const absl::Status status = w.AwaitModule(*net_->fc1);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(w.AwaitModule(*net_->fc2).code(), status.code());
  EXPECT_EQ(w.AwaitAll().status().code(), status.code());
}

// Parameters the pull cannot write into, refused before any connection.
struct Odd : torch::nn::Module {
  explicit Odd(torch::Tensor p) { register_parameter("w", std::move(p)); }
};

TEST(TorchWorkerStartTest, RefusesParametersThatAreNotContiguousFp32) {
  WorkerOptions o;
  o.shard_addresses = {"127.0.0.1:1"};
  o.connect_timeout = milliseconds(100);
  Odd transposed(torch::zeros({4, 3}).t());
  auto a = TorchWorker::Start(o, transposed);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("parameter 'w' is not contiguous"));
  Odd fp64(torch::zeros({3}, torch::kFloat64));
  auto b = TorchWorker::Start(o, fp64);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("parameter 'w' is Double"));
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("fp32"));
}

TEST(TorchWorkerStartTest, LayoutFollowsNamedParametersWithPriorityOverrides) {
  Net net;
  TorchWorkerOptions t;
  t.priority["fc2.bias"] = -1;
  auto layout = MakeLayout(net, 2, t);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors().size(), 6u);
  EXPECT_EQ(layout->tensors()[0].name, "fc1.weight");
  EXPECT_EQ(layout->tensors()[0].priority, 0);
  EXPECT_EQ(layout->tensors()[2].name, "fc2.weight");
  EXPECT_EQ(layout->tensors()[2].priority, 2);
  EXPECT_EQ(layout->tensors()[3].priority, -1);
  EXPECT_EQ(layout->tensors()[0].row_elems, 8u) << "fc1.weight: 16 rows of 8 inputs";
  EXPECT_EQ(layout->tensors()[1].row_elems, 0u) << "a bias has no rows";
  EXPECT_EQ(layout->num_shards(), 2u);
  // Slices of 20 values hold two whole rows of 8.
  TorchWorkerOptions small = t;
  small.priority.clear();
  small.slice_elems = 20;
  auto cut = MakeLayout(net, 1, small);
  ASSERT_TRUE(cut.ok()) << cut.status();
  for (uint32_t id : cut->SlicesOfTensor(0)) {
    EXPECT_EQ(cut->slices()[id].numel, 16u) << id;
    EXPECT_EQ(cut->slices()[id].offset % 8, 0u) << id;
  }
  t.priority["nope"] = 0;
  EXPECT_THAT(std::string(MakeLayout(net, 1, t).status().message()), HasSubstr("'nope'"));
}

}  // namespace
}  // namespace ps::worker_torch
