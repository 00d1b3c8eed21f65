// Real gRPC shards on loopback and several ps::Worker clients (as threads).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "cluster_util.h"
#include "codecs/codec.h"
#include "core/data_plane.h"
#include "core/device.h"
#include "gpu/cuda_device.h"
#include "server/optimizer.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

constexpr milliseconds kPullTimeout{20000};

std::vector<core::TensorSpec> Tensors() {
  return {{"layer1.weight", 1000, 0}, {"layer1.bias", 10, 1}, {"layer2.weight", 333, 2}};
}

core::ModelLayout Layout(uint32_t shards) {
  return *core::ModelLayout::Create(Tensors(), /*slice_elems=*/128, shards);
}

using testing::ClientOptions;

server::ServerOptions BaseOptions(uint32_t n, uint32_t f, const std::string& rule) {
  server::ServerOptions o;
  o.num_workers = n;
  o.num_byzantine = f;
  o.aggregator = rule;
  o.threads = 2;
  o.round_deadline = milliseconds(20000);
  return o;
}

// Deterministic gradient of worker w for tensor t.
std::vector<float> Grad(uint32_t w, size_t t, size_t numel, uint64_t round) {
  std::vector<float> g(numel);
  for (size_t i = 0; i < numel; ++i) {
    g[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(w) +
                    0.1f * static_cast<float>(t) + 0.7f * static_cast<float>(round));
  }
  return g;
}

std::vector<std::vector<float>> Initial(const core::ModelLayout& l) {
  std::vector<std::vector<float>> init;
  for (const auto& t : l.tensors()) {
    std::vector<float> v(t.numel);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 17);
    init.push_back(std::move(v));
  }
  return init;
}

using testing::Spans;

// Runs `rounds` synchronous rounds with n workers (threads); returns worker 0's final
// parameters.
std::vector<std::vector<float>> Train(const testing::Cluster& c, const core::ModelLayout& layout,
                                      uint32_t n, uint64_t rounds,
                                      const std::function<void(WorkerOptions&)>& adjust = {}) {
  const auto init = Initial(layout);
  std::vector<std::vector<std::vector<float>>> params(n);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions options = ClientOptions(c, w);
      if (adjust) adjust(options);
      auto worker = Worker::Start(options, layout, Spans(init));
      ASSERT_TRUE(worker.ok()) << worker.status();
      auto& p = params[w];
      for (const auto& t : layout.tensors()) p.emplace_back(t.numel);
      std::vector<std::span<float>> outs(p.begin(), p.end());
      for (uint64_t r = 0; r < rounds; ++r) {
        auto v = (*worker)->PullAll(r, outs, kPullTimeout);
        ASSERT_TRUE(v.ok()) << v.status();
        ASSERT_GE(*v, r);
        // Kept until WaitPushes returns: a borrowed push (PushOptions::borrow) reads them
        // until then.
        std::vector<std::vector<float>> grads;
        for (size_t t = 0; t < layout.tensors().size(); ++t) {
          grads.push_back(Grad(w, t, layout.tensors()[t].numel, r));
          ASSERT_TRUE((*worker)->Push(t, r, grads.back()).ok());
        }
        ASSERT_TRUE((*worker)->WaitPushes().ok());
      }
      auto v = (*worker)->PullAll(rounds, outs, kPullTimeout);
      ASSERT_TRUE(v.ok()) << v.status();
    });
  }
  for (auto& t : threads) t.join();
  return params[0];
}

// Shard count and data plane: workers leave WorkerOptions::data_plane unset and follow
// the plane the shards' Join answers name.
class MultiShardTest : public ::testing::TestWithParam<std::tuple<uint32_t, core::DataPlane>> {};

TEST_P(MultiShardTest, RoundsEqualAReferenceComputedHere) {
  const auto [shards, plane] = GetParam();
  const uint32_t n = 4;
  server::ServerOptions o = BaseOptions(n, 0, "mean");
  o.data_plane = plane;
  o.learning_rate = 0.5f;
  o.momentum = 0.9f;
  o.weight_decay = 0.01f;
  testing::Cluster c = testing::StartCluster(shards, o);
  ASSERT_EQ(c.num_shards(), shards);
  const core::ModelLayout layout = Layout(shards);
  const uint64_t rounds = 3;
  auto got = Train(c, layout, n, rounds);

  // Reference: SGD with momentum on the mean of the workers' gradients.
  auto w = Initial(layout);
  for (size_t t = 0; t < w.size(); ++t) {
    std::vector<float> v(w[t].size(), 0.0f);
    for (uint64_t r = 0; r < rounds; ++r) {
      std::vector<float> mean(w[t].size(), 0.0f);
      for (uint32_t k = 0; k < n; ++k) {
        auto g = Grad(k, t, w[t].size(), r);
        for (size_t i = 0; i < g.size(); ++i) mean[i] += g[i];
      }
      for (size_t i = 0; i < mean.size(); ++i) {
        const float d = mean[i] / static_cast<float>(n) + 0.01f * w[t][i];
        v[i] = 0.9f * v[i] + d;
        w[t][i] -= 0.5f * v[i];
      }
    }
    ASSERT_EQ(got[t].size(), w[t].size());
    for (size_t i = 0; i < w[t].size(); ++i) {
      ASSERT_NEAR(got[t][i], w[t][i], 1e-4) << "tensor " << t << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, MultiShardTest,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u), testing::DataPlanes()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "shards_" +
                                  testing::PlaneName(std::get<1>(info.param));
                         });

// Model scope over real gRPC shards: distance-based rules on the whole gradient, the
// shards exchanging Gram shares over PeerService. The workers' gradients differ by a
// phase, so per slice the rules would pick differently; the result after a few SGD
// rounds must match the rule applied here to the concatenated gradients.
class ModelScopeClusterTest
    : public ::testing::TestWithParam<std::tuple<std::string, uint32_t, core::DataPlane>> {};

TEST_P(ModelScopeClusterTest, ShardedRoundsMatchTheRuleOnWholeGradients) {
  const auto& [rule, shards, plane] = GetParam();
  const uint32_t n = 5;
  server::ServerOptions o = BaseOptions(n, 1, rule);
  o.data_plane = plane;
  o.quorum = n;  // Krum's bound is n >= 2f + 3 = 5: every worker, every round
  o.learning_rate = 0.5f;
  o.momentum = 0.0f;
  testing::Cluster c = testing::StartCluster(shards, o);
  ASSERT_EQ(c.num_shards(), shards);
  for (size_t i = 0; i < c.num_shards(); ++i) ASSERT_TRUE(c.shard(i).shard().model_scope());
  const core::ModelLayout layout = Layout(shards);
  const uint64_t rounds = 3;
  auto got = Train(c, layout, n, rounds);

  aggregators::AggregatorOptions a;
  a.num_workers = static_cast<int>(n);
  a.num_byzantine = 1;
  auto agg = aggregators::MakeAggregator(rule, a);
  ASSERT_TRUE(agg.ok()) << agg.status();
  auto w = Initial(layout);
  size_t total = 0;
  for (const auto& t : w) total += t.size();
  std::vector<float> state((*agg)->StateRows() * total, 0.0f);
  for (uint64_t r = 0; r < rounds; ++r) {
    std::vector<std::vector<float>> whole(n);
    for (uint32_t k = 0; k < n; ++k) {
      for (size_t t = 0; t < w.size(); ++t) {
        auto g = Grad(k, t, w[t].size(), r);
        whole[k].insert(whole[k].end(), g.begin(), g.end());
      }
    }
    std::vector<const float*> ptrs;
    for (const auto& v : whole) ptrs.push_back(v.data());
    std::vector<float> agg_out(total);
    aggregators::AggregationContext ctx;
    ctx.state = state;
    ASSERT_TRUE((*agg)->Aggregate(ptrs, agg_out, ctx).ok());
    size_t at = 0;
    for (auto& t : w) {
      for (float& x : t) x -= 0.5f * agg_out[at++];
    }
  }
  for (size_t t = 0; t < w.size(); ++t) {
    for (size_t i = 0; i < w[t].size(); ++i) {
      ASSERT_NEAR(got[t][i], w[t][i], 1e-4) << rule << " tensor " << t << " element " << i;
    }
  }
  for (size_t i = 0; i < c.num_shards(); ++i) {
    EXPECT_EQ(c.shard(i).shard().stats().model_rounds, rounds);
    EXPECT_EQ(c.shard(i).shard().stats().model_rounds_dropped, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, ModelScopeClusterTest,
    ::testing::Combine(::testing::Values("krum", "multi_krum", "geometric_median",
                                         "centered_clipping(tau=0.5)"),
                       ::testing::Values(1u, 2u, 3u), testing::DataPlanes()),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      name = name.substr(0, name.find('('));
      return name + "_" + std::to_string(std::get<1>(info.param)) + "shards_" +
             testing::PlaneName(std::get<2>(info.param));
    });

// n = 9 workers, f = 2 Byzantine pushing a huge negative gradient, aggregate-only so
// the published value is the aggregate itself.
class ByzantineTest
    : public ::testing::TestWithParam<std::tuple<std::string, core::DataPlane>> {};

TEST_P(ByzantineTest, RobustRuleStaysInHonestRangeWhileMeanIsDragged) {
  const auto& [rule, plane] = GetParam();
  const uint32_t n = 9, f = 2;  // quorum n - f = 7 >= 2f + 3 for Krum
  server::ServerOptions o = BaseOptions(n, f, rule);
  o.data_plane = plane;
  o.aggregate_only = true;
  testing::Cluster c = testing::StartCluster(2, o);
  ASSERT_EQ(c.num_shards(), 2u);
  const core::ModelLayout layout = Layout(2);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      auto worker = Worker::Start(ClientOptions(c, w), layout);
      ASSERT_TRUE(worker.ok()) << worker.status();
      for (size_t t = 0; t < layout.tensors().size(); ++t) {
        std::vector<float> g(layout.tensors()[t].numel);
        std::mt19937 rng(w * 100 + t);
        std::uniform_real_distribution<float> honest(0.9f, 1.1f);
        for (float& x : g) x = w < f ? -1e6f : honest(rng);
        ASSERT_TRUE((*worker)->Push(t, 0, g).ok());
      }
      ASSERT_TRUE((*worker)->WaitPushes().ok());
    });
  }
  for (auto& t : threads) t.join();
  auto reader = Worker::Start(ClientOptions(c, 0), layout);
  ASSERT_TRUE(reader.ok());
  for (size_t t = 0; t < layout.tensors().size(); ++t) {
    std::vector<float> agg(layout.tensors()[t].numel);
    ASSERT_TRUE((*reader)->Pull(t, 1, agg, kPullTimeout).ok());
    const auto [lo, hi] = std::minmax_element(agg.begin(), agg.end());
    if (rule == "mean") {
      EXPECT_LT(*hi, -1e5f) << "the mean should be dragged by the attackers";
    } else {
      EXPECT_GE(*lo, 0.9f) << rule << " left the honest range";
      EXPECT_LE(*hi, 1.1f) << rule << " left the honest range";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, ByzantineTest,
    ::testing::Combine(::testing::Values("mean", "median", "trimmed_mean", "krum", "multi_krum"),
                       testing::DataPlanes()),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + testing::PlaneName(std::get<1>(info.param));
    });

// Local-update training (AdaComm): the losses the workers report with their pushes come
// back with the next version as medians, which the two liars of five cannot move out of
// the honest losses' range; the first round's median stays as F(x_0).
TEST(ClusterTest, ShardsPublishTheMedianOfTheReportedLosses) {
  const uint32_t n = 5;
  testing::Cluster c = testing::StartCluster(2, BaseOptions(n, 2, "median"));
  const core::ModelLayout layout = Layout(2);
  const std::vector<std::vector<float>> init = Initial(layout);
  const std::vector<std::span<const float>> init_spans = Spans(init);
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t w = 0; w < n; ++w) {
    auto worker = Worker::Start(ClientOptions(c, w), layout, init_spans);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  EXPECT_EQ(workers[0]->published_loss(), std::nullopt);
  EXPECT_EQ(workers[0]->ReportLoss(0, std::nan("")).code(), absl::StatusCode::kInvalidArgument);
  // Round r: workers 0 and 1 lie (huge losses), the others report honest[r].
  const std::vector<std::vector<float>> honest = {{2.0f, 2.5f, 3.0f}, {0.5f, 1.0f, 1.25f}};
  for (uint64_t r = 0; r < honest.size(); ++r) {
    for (uint32_t w = 0; w < n; ++w) {
      ASSERT_TRUE(workers[w]->ReportLoss(r, w < 2 ? 1e30 : honest[r][w - 2]).ok());
      for (size_t t = 0; t < layout.tensors().size(); ++t) {
        ASSERT_TRUE(workers[w]->Push(t, r, Grad(w, t, layout.tensors()[t].numel, r)).ok());
      }
    }
    for (auto& w : workers) ASSERT_TRUE(w->WaitPushes().ok());
    std::vector<std::vector<float>> values = Initial(layout);
    std::vector<std::span<float>> outs(values.begin(), values.end());
    for (auto& w : workers) ASSERT_TRUE(w->PullAll(r + 1, outs, kPullTimeout).ok());
    for (auto& w : workers) {
      const std::optional<PublishedLoss> got = w->published_loss();
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(got->version, r + 1);
      EXPECT_GE(got->loss, honest[r].front());
      EXPECT_LE(got->loss, honest[r].back());
      EXPECT_EQ(got->loss, honest[r].back()) << "median of the three honest and two huge";
      EXPECT_EQ(got->first_loss, honest[0].back());
    }
  }
}

// Each tensor pushed with its own codec; the shards decode each push by the codec it
// names. The reference applies the same codecs' round trip to the gradients.
class PlaneTest : public ::testing::TestWithParam<core::DataPlane> {};

INSTANTIATE_TEST_SUITE_P(Planes, PlaneTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

// Tensors whose layout names an optimizer are stepped by it on the shards, at the
// learning rate their round's pushes carried (the median: worker 2 asks for 100), with
// its state kept across rounds; a tensor without one gets the shards' own SGD (lr 0.5).
// The reference runs the same optimizers here on the mean of the workers' gradients.
TEST_P(PlaneTest, TensorsAreSteppedByTheirOwnOptimizersAtTheRatesPushed) {
  const uint32_t n = 3;
  server::ServerOptions o = BaseOptions(n, 0, "mean");
  o.data_plane = GetParam();
  o.learning_rate = 0.5f;
  o.momentum = 0.0f;
  testing::Cluster c = testing::StartCluster(2, o);
  const std::vector<std::string> specs = {
      "adam(lr=0.1, weight_decay=0.01)", "sgd(lr=1, momentum=0.9, nesterov=1, weight_decay=0.001)",
      ""};
  std::vector<core::TensorSpec> tensors = Tensors();
  for (size_t t = 0; t < tensors.size(); ++t) tensors[t].optimizer = specs[t];
  const core::ModelLayout layout = *core::ModelLayout::Create(tensors, /*slice_elems=*/128, 2);
  const auto lr_of = [](uint64_t r) { return 0.05f * std::cos(0.3f * static_cast<float>(r)); };
  const uint64_t rounds = 4;
  const std::vector<std::vector<float>> init = Initial(layout);
  std::vector<std::vector<std::vector<float>>> got(n);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      auto worker = Worker::Start(ClientOptions(c, w), layout, Spans(init));
      ASSERT_TRUE(worker.ok()) << worker.status();
      auto& p = got[w];
      for (const auto& t : layout.tensors()) p.emplace_back(t.numel);
      std::vector<std::span<float>> outs(p.begin(), p.end());
      EXPECT_EQ((*worker)->SetLearningRate(0, -1).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ((*worker)->SetLearningRate(9, 0.1).code(), absl::StatusCode::kInvalidArgument);
      for (uint64_t r = 0; r < rounds; ++r) {
        ASSERT_TRUE((*worker)->PullAll(r, outs, kPullTimeout).ok());
        for (size_t t = 0; t < 2; ++t) {
          ASSERT_TRUE((*worker)->SetLearningRate(t, w == 2 ? 100.0 : lr_of(r)).ok());
        }
        for (size_t t = 0; t < layout.tensors().size(); ++t) {
          ASSERT_TRUE((*worker)->Push(t, r, Grad(w, t, layout.tensors()[t].numel, r)).ok());
        }
        ASSERT_TRUE((*worker)->WaitPushes().ok());
      }
      ASSERT_TRUE((*worker)->PullAll(rounds, outs, kPullTimeout).ok());
    });
  }
  for (auto& t : threads) t.join();

  for (size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> w = init[t], m(w.size(), 0.0f), v(w.size(), 0.0f);
    const std::optional<server::Optimizer> opt =
        specs[t].empty() ? std::nullopt : std::optional(*server::Optimizer::Parse(specs[t]));
    for (uint64_t r = 0; r < rounds; ++r) {
      std::vector<float> mean(w.size(), 0.0f);
      for (uint32_t k = 0; k < n; ++k) {
        const std::vector<float> g = Grad(k, t, w.size(), r);
        for (size_t i = 0; i < g.size(); ++i) mean[i] += g[i] / static_cast<float>(n);
      }
      if (opt.has_value()) {
        opt->Step(lr_of(r), r + 1, mean, m, v, w);
      } else {
        for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * mean[i];
      }
    }
    for (uint32_t k = 0; k < n; ++k) {
      ASSERT_EQ(got[k][t].size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_NEAR(got[k][t][i], w[i], 1e-5) << "worker " << k << " tensor " << t << " value " << i;
      }
    }
    // The rounds moved the values (a reference that stood still would match anything).
    float moved = 0;
    for (size_t i = 0; i < w.size(); ++i) moved = std::max(moved, std::abs(w[i] - init[t][i]));
    EXPECT_GT(moved, 1e-2f) << "tensor " << t;
  }
}

TEST_P(PlaneTest, TensorsPushWithTheirOwnCodecs) {
  const uint32_t n = 3;
  server::ServerOptions o = BaseOptions(n, 0, "mean");
  o.data_plane = GetParam();
  o.learning_rate = 0.5f;
  o.momentum = 0;
  o.weight_decay = 0;
  testing::Cluster c = testing::StartCluster(2, o);
  const core::ModelLayout layout = Layout(2);
  const std::vector<std::string> codec_of = {"bf16", "fp16", "fp32"};  // default: fp32
  auto got = Train(c, layout, n, 2, [&](WorkerOptions& w) {
    w.tensor_push["layer1.weight"].codec = codec_of[0];
    w.tensor_push["layer1.bias"].codec = codec_of[1];
  });
  auto w = Initial(layout);
  for (size_t t = 0; t < w.size(); ++t) {
    auto codec = codecs::MakeCodec(codec_of[t]);
    ASSERT_TRUE(codec.ok());
    for (uint64_t r = 0; r < 2; ++r) {
      std::vector<double> sum(w[t].size(), 0);
      for (uint32_t k = 0; k < n; ++k) {
        const auto g = Grad(k, t, w[t].size(), r);
        // Slices of 128 values, each encoded on its own (the codec is elementwise here).
        std::string bytes;
        ASSERT_TRUE((*codec)->Encode(g, &bytes).ok());
        std::vector<float> d(g.size());
        ASSERT_TRUE((*codec)->Decode(bytes, d).ok());
        for (size_t i = 0; i < d.size(); ++i) sum[i] += d[i];
      }
      for (size_t i = 0; i < sum.size(); ++i) {
        w[t][i] -= 0.5f * static_cast<float>(sum[i] / n);
      }
    }
    for (size_t i = 0; i < w[t].size(); ++i) {
      ASSERT_NEAR(got[t][i], w[t][i], 1e-5) << codec_of[t] << " element " << i;
    }
  }
}

// Borrowed pushes (PushOptions::borrow) send the caller's values where they lie: the
// shards' parameters come out bit for bit as with copied pushes, a tensor whose codec
// cannot borrow (fp16 here) copying as before.
TEST_P(PlaneTest, BorrowedPushesTrainToTheBitsCopiedPushesDo) {
  const uint32_t n = 3;
  server::ServerOptions o = BaseOptions(n, 0, "mean");
  o.data_plane = GetParam();
  const core::ModelLayout layout = Layout(2);
  std::vector<std::vector<std::vector<float>>> got;
  for (const bool borrow : {false, true}) {
    testing::Cluster c = testing::StartCluster(2, o);
    got.push_back(Train(c, layout, n, 3, [&](WorkerOptions& w) {
      w.push.borrow = borrow;
      w.tensor_push["layer1.bias"].codec = "fp16";
      w.tensor_push["layer1.bias"].borrow = borrow;
    }));
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  for (size_t t = 0; t < got[0].size(); ++t) {
    ASSERT_EQ(got[0][t].size(), got[1][t].size());
    EXPECT_EQ(0, std::memcmp(got[0][t].data(), got[1][t].data(), got[0][t].size() * sizeof(float)))
        << "tensor " << t;
  }
  EXPECT_NE(got[1][0], Initial(layout)[0]);  // the rounds changed something
}

TEST(ClusterTest, PushOptionsForAnUnknownTensorAreRefused) {
  testing::Cluster c = testing::StartCluster(1, BaseOptions(2, 0, "mean"));
  WorkerOptions options = ClientOptions(c, 0);
  options.tensor_push["layer9.weight"].codec = "fp16";
  auto worker = Worker::Start(options, Layout(1), Spans(Initial(Layout(1))));
  ASSERT_FALSE(worker.ok());
  EXPECT_THAT(std::string(worker.status().message()),
              HasSubstr("push options for tensor 'layer9.weight', which the layout does not have"));
  options.tensor_push.clear();
  options.push.codec = "int8(bucket=0)";
  worker = Worker::Start(options, Layout(1), Spans(Initial(Layout(1))));
  ASSERT_FALSE(worker.ok());
  EXPECT_THAT(std::string(worker.status().message()), HasSubstr("push options of tensor"));
}

// PushOptions::device = kCuda where no device (or no CUDA build) can encode: the pushes
// encode on the CPU into the same bytes, and device_note() says why, per tensor.
TEST(ClusterTest, DeviceNoteSaysWhyATensorEncodesOnTheCpu) {
  testing::Cluster c = testing::StartCluster(1, BaseOptions(1, 0, "mean"));
  WorkerOptions options = ClientOptions(c, 0);
  options.tensor_push["layer1.weight"].codec = "fp16";
  options.tensor_push["layer1.weight"].device = core::Device::kCuda;
  options.tensor_push["layer1.bias"].codec = "int8";  // no GPU encoder
  options.tensor_push["layer1.bias"].device = core::Device::kCuda;
  auto worker = Worker::Start(options, Layout(1), Spans(Initial(Layout(1))));
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_EQ((*worker)->layout().tensors()[0].name, "layer1.weight");
  const std::string weight = (*worker)->device_note(0);
  const std::string bias = (*worker)->device_note(1);
  EXPECT_TRUE((*worker)->device_note(2).empty()) << "fp32 on the CPU, as asked";
  EXPECT_TRUE((*worker)->device_note(99).empty());
  EXPECT_THAT(bias, HasSubstr("encoding on the CPU"));
  if (gpu::CudaDevice().ok()) {
    EXPECT_TRUE(weight.empty()) << weight;
    EXPECT_THAT(bias, HasSubstr("no GPU encoder for 'int8"));
  } else {
    EXPECT_THAT(weight, HasSubstr("device=cuda requested but unavailable"));
    EXPECT_THAT(weight, HasSubstr("encoding on the CPU"));
  }
  // The pushes go through either way.
  const std::vector<float> grad((*worker)->layout().tensors()[0].numel, 0.5f);
  ASSERT_TRUE((*worker)->Push(0, (*worker)->start_version(), grad).ok());
  EXPECT_TRUE((*worker)->WaitPushes().ok());
}

TEST(ClusterTest, LaterJoinerWithAnotherLayoutIsRefused) {
  testing::Cluster c = testing::StartCluster(1, BaseOptions(2, 0, "mean"));
  const core::ModelLayout layout = Layout(1);
  auto init = Initial(layout);
  auto first = Worker::Start(ClientOptions(c, 0), layout, Spans(init));
  ASSERT_TRUE(first.ok()) << first.status();
  auto other = *core::ModelLayout::Create({{"x", 5, 0}}, 128, 1);
  auto second = Worker::Start(ClientOptions(c, 1), other);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("layout mismatch"));
  // The worker joined once more with its layout, so the refusal names the first tensor
  // that differs, not only two hashes.
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("tensor 0 differs: the shard's is '",
                                     layout.tensors()[0].name, "' (", layout.tensors()[0].numel,
                                     " elements, priority 0), the worker's 'x' (5 elements, "
                                     "priority 0)")));
}

// WorkerOptions::may_register = false (Horovod's root_rank): worker 1 joins first with
// values of its own but waits for worker 0, the root, to register the layout, so both
// start from the root's values; alone, it says what it waited for.
TEST(ClusterTest, AWorkerThatMayNotRegisterStartsFromTheRootsValues) {
  testing::Cluster c = testing::StartCluster(1, BaseOptions(2, 0, "mean"));
  const core::ModelLayout layout = Layout(1);
  const auto root_values = Initial(layout);
  std::vector<std::vector<float>> own;
  for (const auto& t : root_values) own.emplace_back(t.size(), 9.0f);

  WorkerOptions lone = ClientOptions(c, 1);
  lone.may_register = false;
  lone.connect_timeout = milliseconds(600);
  auto alone = Worker::Start(lone, layout, Spans(own));
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded) << alone.status();
  EXPECT_THAT(alone.status().message(),
              HasSubstr("has no parameters yet, and worker 1 does not register them"));

  std::vector<std::vector<float>> got(root_values.size());
  absl::Status follower = absl::OkStatus();
  std::thread first([&] {
    WorkerOptions o = ClientOptions(c, 1);
    o.may_register = false;
    auto w = Worker::Start(o, layout, Spans(own));
    if (!w.ok()) {
      follower = w.status();
      return;
    }
    std::vector<std::span<float>> outs;
    for (size_t t = 0; t < got.size(); ++t) {
      got[t].resize(root_values[t].size());
      outs.emplace_back(got[t]);
    }
    follower = (*w)->PullAll(0, outs, milliseconds(20000)).status();
  });
  std::this_thread::sleep_for(milliseconds(500));  // worker 1 is waiting by now
  auto root = Worker::Start(ClientOptions(c, 0), layout, Spans(root_values));
  first.join();
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(follower.ok()) << follower;
  EXPECT_EQ(got, root_values);
}

// Objects one worker keeps on shard 0 for the others: a reader waits for the version it
// needs, and sees each worker's keys apart; bad keys, owners and sizes are refused.
TEST(ClusterTest, WorkersReadTheObjectsAnotherStored) {
  server::ServerOptions o = BaseOptions(2, 0, "mean");
  o.max_object_bytes = 1024;
  testing::Cluster c = testing::StartCluster(2, o);
  const core::ModelLayout layout = Layout(2);
  const std::vector<std::vector<float>> init = Initial(layout);
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t w = 0; w < 2; ++w) {
    auto worker = Worker::Start(ClientOptions(c, w), layout, Spans(init));
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  EXPECT_EQ(workers[1]->GetObject(0, "state", 1, milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread root([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_EQ(*workers[0]->PutObject("state", "v1"), 1u);
    ASSERT_EQ(*workers[0]->PutObject("state", "v2"), 2u);
  });
  absl::StatusOr<Worker::StoredObject> got =
      workers[1]->GetObject(0, "state", 2, milliseconds(20000));
  root.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 2u);
  EXPECT_EQ(got->value, "v2");
  ASSERT_TRUE(workers[1]->PutObject("state", "worker 1's").ok());
  EXPECT_EQ(workers[0]->GetObject(0, "state", 1, milliseconds(1000))->value, "v2");
  EXPECT_EQ(workers[0]->GetObject(1, "state", 1, milliseconds(1000))->value, "worker 1's");
  const absl::Status big = workers[0]->PutObject("big", std::string(2000, 'x')).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_EQ(workers[0]->PutObject("bad key", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(workers[0]->GetObject(5, "state", 1, milliseconds(1000)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ClusterTest, WorkerIdOutsideTheClusterIsRefused) {
  // Authenticated, worker 5 of 2 has no token at all; the rank check itself shows
  // without authentication.
  server::ServerOptions o = BaseOptions(2, 0, "mean");
  o.insecure = true;
  testing::Cluster c = testing::StartCluster(1, o);
  auto w = Worker::Start(ClientOptions(c, 5), Layout(1));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("worker id 5 is out of range"));
}

TEST_P(PlaneTest, RoundClosesAtDeadlineWithQuorumAndStragglerIsLate) {
  server::ServerOptions o = BaseOptions(3, 1, "mean");
  o.data_plane = GetParam();
  o.round_deadline = milliseconds(300);
  o.aggregate_only = true;
  testing::Cluster c = testing::StartCluster(1, o);
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 8, 0}}, 128, 1);
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t w = 0; w < 3; ++w) {
    auto worker = Worker::Start(ClientOptions(c, w), layout);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(workers[w]->Push(0, 0, std::vector<float>(8, float(w + 1))).ok());
    ASSERT_TRUE(workers[w]->WaitPushes().ok());
  }
  std::vector<float> agg(8);
  auto v = workers[0]->Pull(0, 1, agg, kPullTimeout);  // waits for the deadline
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FLOAT_EQ(agg[0], 1.5f);
  ASSERT_TRUE(workers[2]->Push(0, 0, std::vector<float>(8, 100.0f)).ok());
  absl::Status late = workers[2]->WaitPushes();
  EXPECT_EQ(late.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(late.message(), HasSubstr("late push"));
  EXPECT_THAT(late.message(), HasSubstr("tensor 'w'"));
  // The shard's kind crossed the data plane and the worker's context: callers branch on it.
  const std::optional<PushFailure> failure = PushFailureOf(late);
  ASSERT_TRUE(failure.has_value()) << late;
  EXPECT_EQ(failure->reason, "late");
  EXPECT_EQ(failure->tensor, "w");
  EXPECT_EQ(failure->round, 0u);
}

TEST_P(PlaneTest, PullTimesOutWhenTheVersionNeverComes) {
  server::ServerOptions o = BaseOptions(2, 0, "mean");
  o.data_plane = GetParam();
  testing::Cluster c = testing::StartCluster(1, o);
  const core::ModelLayout layout = Layout(1);
  auto init = Initial(layout);
  auto w = Worker::Start(ClientOptions(c, 0), layout, Spans(init));
  ASSERT_TRUE(w.ok());
  std::vector<float> out(layout.tensors()[1].numel);
  auto v = (*w)->Pull(1, 5, out, milliseconds(300));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ClusterTest, StartRefusesRuleBoundsWithTheBoundInTheMessage) {
  server::ServerOptions five = BaseOptions(5, 2, "krum");
  five.insecure = true;  // the rule's bound is the refusal looked at here
  auto s = server::Server::Start(five);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("2f + 3"));
  server::ServerOptions o = BaseOptions(9, 2, "krum");
  o.quorum = 5;  // below 2f + 3 = 7
  o.port = 0;
  o.insecure = true;
  auto q = server::Server::Start(o);
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("quorum 5"));
}

TEST(ClusterTest, ShardsWithDifferentConfigurationsStopServing) {
  const std::vector<uint16_t> ports = testing::PickFreePorts(2);
  ASSERT_EQ(ports.size(), 2u);
  const std::vector<std::string> addrs = {absl::StrCat("127.0.0.1:", ports[0]),
                                          absl::StrCat("127.0.0.1:", ports[1])};
  std::vector<std::unique_ptr<server::Server>> shards;
  for (int i = 0; i < 2; ++i) {
    server::ServerOptions o = BaseOptions(4, 1, i == 0 ? "median" : "trimmed_mean");
    o.num_shards = 2;
    o.shard_id = i;
    o.peers = addrs;
    o.port = ports[i];
    o.insecure = true;
    auto s = server::Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    shards.push_back(*std::move(s));
  }
  bool both_down = false;
  for (int i = 0; i < 100 && !both_down; ++i) {  // bounded: 10 s
    both_down = !shards[0]->serving() && !shards[1]->serving();
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(both_down) << "shards with different rules kept serving";
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// Compressed pulls (--pull-codec, docs/data_path.md): every worker holds the same bits
// whichever way its values came: as changes applied version after version, densely
// after it missed versions, or densely after it restarted with nothing held. And the
// changes do go out compressed.
class CompressedPullTest : public ::testing::TestWithParam<core::DataPlane> {};

INSTANTIATE_TEST_SUITE_P(Planes, CompressedPullTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

TEST_P(CompressedPullTest, CompressedPullsGiveEveryWorkerTheSameBits) {
  const uint32_t n = 2;
  server::ServerOptions o = BaseOptions(n, 0, "mean");
  o.data_plane = GetParam();
  o.learning_rate = 0.1f;
  o.pull_codec = "3lc(s=1.9)";
  testing::Cluster c = testing::StartCluster(2, o);
  const core::ModelLayout layout = Layout(2);
  const auto init = Initial(layout);
  std::vector<std::unique_ptr<Worker>> workers(n);
  auto start = [&](uint32_t w) {
    auto worker = Worker::Start(ClientOptions(c, w), layout, Spans(init));
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers[w] = *std::move(worker);
  };
  start(0);
  start(1);
  std::vector<std::vector<std::vector<float>>> params(n);
  for (auto& p : params) {
    for (const auto& t : layout.tensors()) p.emplace_back(t.numel);
  }
  auto pull = [&](uint32_t w, uint64_t r) {
    std::vector<std::span<float>> outs(params[w].begin(), params[w].end());
    auto v = workers[w]->PullAll(r, outs, kPullTimeout);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(*v, r);
  };
  auto same = [&](uint64_t r) {
    for (size_t t = 0; t < params[0].size(); ++t) {
      ASSERT_EQ(std::memcmp(params[0][t].data(), params[1][t].data(),
                            params[0][t].size() * sizeof(float)),
                0)
          << "tensor " << t << " at version " << r;
    }
  };
  constexpr uint64_t kRounds = 14;
  bool moved = false;
  for (uint64_t r = 0; r < kRounds; ++r) {
    const bool misses = r >= 4 && r <= 6;  // worker 1 pulls nothing of versions 4..6
    if (r == 9) start(1);                  // worker 1 restarts: it holds nothing
    pull(0, r);
    if (!misses) {
      pull(1, r);
      same(r);
    }
    moved = moved || params[0][0] != init[0];
    for (uint32_t w = 0; w < n; ++w) {
      for (size_t t = 0; t < layout.tensors().size(); ++t) {
        ASSERT_TRUE(workers[w]->Push(t, r, Grad(w, t, layout.tensors()[t].numel, r)).ok());
      }
      ASSERT_TRUE(workers[w]->WaitPushes().ok());
    }
  }
  pull(0, kRounds);
  pull(1, kRounds);
  same(kRounds);
  EXPECT_TRUE(moved) << "the parameters never changed";
  // Worker 0 pulled every version: all but the first as 3lc changes, a small fraction of
  // the dense bytes.
  uint64_t dense = 0;
  for (const auto& t : layout.tensors()) dense += t.numel * sizeof(float);
  EXPECT_LT(workers[0]->stats().pull_bytes, dense * (kRounds + 1) / 4);
}

}  // namespace
}  // namespace ps
