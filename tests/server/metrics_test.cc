// The metrics text of one shard driven directly (no network but the UDP socket of a
// receiver on loopback): families present, values after known events.
#include "server/metrics.h"

#include <cmath>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "server/transport/udp/receiver.h"
#include "tests/net/metrics_text.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using net::testing::MetricValue;
using net::testing::ParseMetrics;

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.num_workers = 2;
    o.learning_rate = 1.0f;
    o.momentum = 0.0f;
    aggregators::AggregatorOptions a;
    a.num_workers = 2;
    auto agg = aggregators::MakeAggregator("mean", a);
    ASSERT_TRUE(agg.ok()) << agg.status();
    shard_ = std::make_unique<Shard>(o, 0, *std::move(agg), &clock_, &pool_);
    metrics_ = std::make_unique<Metrics>(shard_.get());
    shard_->SetAggregationObserver([m = metrics_.get()](AggregationStage stage, core::Duration d) {
      m->ObserveAggregation(stage, d);
    });
    auto layout = core::ModelLayout::Create({{"w", 4, 0}}, 4, 1);
    ASSERT_TRUE(layout.ok());
    layout_hash_ = layout->hash();
    ASSERT_TRUE(shard_->Join(0, layout_hash_).ok());
    ASSERT_TRUE(shard_->RegisterLayout(0, *layout).ok());
    std::string init;
    core::AppendFp32(std::vector<float>{1, 1, 1, 1}, &init);
    ASSERT_TRUE(shard_->InitSlice(0, layout_hash_, 0, init).ok());
  }

  static std::string Encode(std::vector<float> v) {
    auto codec = codecs::MakeCodec("fp32");
    std::string out;
    EXPECT_TRUE((*codec)->Encode(v, &out).ok());
    return out;
  }

  void AwaitVersion(uint64_t version) {
    auto done = std::make_shared<absl::Notification>();
    shard_->Watch(0, version, [done](bool) { done->Notify(); });
    ASSERT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10)));
  }

  std::map<std::string, double> Scrape() const { return ParseMetrics(metrics_->Render()); }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Metrics> metrics_;
  uint64_t layout_hash_ = 0;
};

TEST_F(MetricsTest, ShardStateBeforeAnyPush) {
  const std::string text = metrics_->Render();
  EXPECT_THAT(text, HasSubstr("# TYPE ps_shard_info gauge"));
  EXPECT_THAT(text, HasSubstr("aggregator=\"mean\""));
  EXPECT_THAT(text, HasSubstr("shard=\"0\""));
  const auto m = ParseMetrics(text);
  EXPECT_EQ(MetricValue(m, "ps_ready"), 1);
  EXPECT_EQ(MetricValue(m, "ps_workers_expected"), 2);
  EXPECT_EQ(MetricValue(m, "ps_workers_joined"), 1);
  EXPECT_EQ(MetricValue(m, "ps_published_version"), 0);
  EXPECT_EQ(MetricValue(m, "ps_pushes_accepted_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_rounds_closed_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_count"), 0);
  // The data plane's series carry its name: tcp, the default.
  EXPECT_EQ(MetricValue(m, "ps_received_bytes_total{transport=\"tcp\"}"), 0);
  // No UDP receiver: no UDP series; no checkpoint yet: no age.
  EXPECT_THAT(text, Not(HasSubstr("transport=\"udp\"")));
  EXPECT_THAT(text, Not(HasSubstr("ps_udp_")));
  EXPECT_THAT(text, Not(HasSubstr("ps_checkpoint_age_seconds")));
}

TEST_F(MetricsTest, TheProcessFamiliesOfEveryPrometheusClient) {
  const auto m = Scrape();
  EXPECT_GT(MetricValue(m, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(MetricValue(m, "process_virtual_memory_bytes"),
            MetricValue(m, "process_resident_memory_bytes"));
  EXPECT_GT(MetricValue(m, "process_cpu_seconds_total"), 0);
  EXPECT_GE(MetricValue(m, "process_open_fds"), 3);
  EXPECT_GE(MetricValue(m, "process_max_fds"), MetricValue(m, "process_open_fds"));
  // Started within the last hour (the test process), not in the future.
  const double now = static_cast<double>(absl::ToUnixSeconds(absl::Now()));
  EXPECT_LE(MetricValue(m, "process_start_time_seconds"), now + 1);
  EXPECT_GT(MetricValue(m, "process_start_time_seconds"), now - 3600);
}

TEST_F(MetricsTest, EveryRefusalReasonHasASeries) {
  const auto m = ParseMetrics(metrics_->Render());
  for (int r = 0; r < static_cast<int>(Refusal::kCount); ++r) {
    const std::string series = absl::StrCat(
        "ps_refusals_total{reason=\"", std::string(RefusalName(static_cast<Refusal>(r))), "\"}");
    EXPECT_EQ(MetricValue(m, series), 0) << series;
  }
}

TEST_F(MetricsTest, CountsPushesRefusalsRoundsAndBytesOfARound) {
  ASSERT_TRUE(shard_->Join(1, layout_hash_).ok());
  const std::string p0 = Encode({1, 2, 3, 4});
  const std::string p1 = Encode({3, 2, 1, 0});
  ASSERT_TRUE(shard_->Push(0, layout_hash_, 0, 0, "fp32", p0).ok());
  EXPECT_EQ(shard_->Push(0, layout_hash_, 0, 0, "fp32", p0).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(shard_->Push(1, layout_hash_, 0, 0, "no-such-codec", p1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard_->Push(1, layout_hash_, 0, 0, "fp32", p1).ok());
  AwaitVersion(1);
  // A malformed push for the next round quarantines worker 1.
  EXPECT_EQ(shard_->Push(1, layout_hash_, 1, 0, "fp32", "x").code(),
            absl::StatusCode::kInvalidArgument);

  const auto m = Scrape();
  EXPECT_EQ(MetricValue(m, "ps_workers_joined"), 2);
  EXPECT_EQ(MetricValue(m, "ps_pushes_accepted_total"), 2);
  EXPECT_EQ(MetricValue(m, "ps_refusals_total{reason=\"duplicate\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_refusals_total{reason=\"malformed\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_refusals_total{reason=\"unknown_codec\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_refusals_total{reason=\"late\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_quarantines_total"), 1);
  // The same per worker (the refusals only for reasons that occurred).
  EXPECT_EQ(MetricValue(m, "ps_worker_pushes_total{worker=\"0\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_worker_pushes_total{worker=\"1\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_worker_push_refusals_total{worker=\"0\",reason=\"duplicate\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_worker_push_refusals_total{worker=\"1\",reason=\"unknown_codec\"}"),
            1);
  EXPECT_EQ(MetricValue(m, "ps_worker_push_refusals_total{worker=\"1\",reason=\"malformed\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_worker_push_refusals_total{worker=\"0\",reason=\"malformed\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_worker_push_refusals_total{worker=\"0\",reason=\"late\"}"), 0);
  EXPECT_EQ(m.count("ps_worker_push_refusals_total{worker=\"0\",reason=\"unknown_codec\"}"), 0u)
      << "a reason no alert watches appears with its first refusal";
  EXPECT_EQ(MetricValue(m, "ps_worker_quarantines_total{worker=\"0\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_worker_quarantines_total{worker=\"1\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_worker_slice_rounds_missed_total{worker=\"0\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_worker_slice_rounds_missed_total{worker=\"1\"}"), 0);
  // The mean weighs both pushes alike: a share of 1 each; no window closed yet.
  EXPECT_EQ(MetricValue(m, "ps_worker_slice_rounds_aggregated_total{worker=\"0\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_worker_push_latency_seconds_count{worker=\"0\"}"), 1);
  EXPECT_GE(MetricValue(m, "ps_worker_push_latency_seconds_sum{worker=\"0\"}"), 0);
  EXPECT_DOUBLE_EQ(MetricValue(m, "ps_worker_aggregate_share_total{worker=\"0\"}"), 1.0);
  EXPECT_DOUBLE_EQ(MetricValue(m, "ps_worker_aggregate_share_total{worker=\"1\"}"), 1.0);
  EXPECT_TRUE(std::isnan(MetricValue(m, "ps_worker_suspicion{worker=\"1\"}")));
  EXPECT_EQ(MetricValue(m, "ps_worker_suspected{worker=\"1\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_rounds_closed_total"), 1);
  EXPECT_EQ(MetricValue(m, "ps_rounds_closed_at_deadline_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_published_version"), 1);
  // Accepted pushes only: two of 4 fp32 values each.
  EXPECT_EQ(MetricValue(m, "ps_push_wire_bytes_total"), static_cast<double>(p0.size() + p1.size()));
  EXPECT_EQ(MetricValue(m, "ps_push_decoded_bytes_total"), 2 * 4 * 4);
  // One slice aggregated in slice scope (mean needs no Gram matrix).
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"slice\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"model_gram\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"model_apply\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_bucket{stage=\"slice\",le=\"+Inf\"}"),
            1);
}

TEST(MetricsModelScopeTest, TimesTheGramShareAndEveryApply) {
  ServerOptions o;
  o.num_workers = 3;
  o.aggregator = "krum";
  o.learning_rate = 1.0f;
  o.momentum = 0.0f;
  aggregators::AggregatorOptions a;
  a.num_workers = 3;
  auto agg = aggregators::MakeAggregator("krum", a);
  ASSERT_TRUE(agg.ok()) << agg.status();
  core::ManualClock clock;
  core::ThreadPool pool(2);
  Shard shard(o, 0, *std::move(agg), &clock, &pool);
  ASSERT_TRUE(shard.model_scope());
  Metrics metrics(&shard);
  shard.SetAggregationObserver([&metrics](AggregationStage stage, core::Duration d) {
    metrics.ObserveAggregation(stage, d);
  });
  // Two slices of 4.
  auto layout = core::ModelLayout::Create({{"w", 8, 0}}, 4, 1);
  ASSERT_TRUE(layout.ok());
  for (uint32_t w = 0; w < 3; ++w) ASSERT_TRUE(shard.Join(w, layout->hash()).ok());
  ASSERT_TRUE(shard.RegisterLayout(0, *layout).ok());
  std::string init;
  core::AppendFp32(std::vector<float>{0, 0, 0, 0}, &init);
  for (uint32_t slice = 0; slice < 2; ++slice) {
    ASSERT_TRUE(shard.InitSlice(0, layout->hash(), slice, init).ok());
  }
  auto codec = codecs::MakeCodec("fp32");
  for (uint32_t w = 0; w < 3; ++w) {
    std::string payload;
    ASSERT_TRUE((*codec)->Encode(std::vector<float>(4, static_cast<float>(w)), &payload).ok());
    for (uint32_t slice = 0; slice < 2; ++slice) {
      ASSERT_TRUE(shard.Push(w, layout->hash(), 0, slice, "fp32", payload).ok());
    }
  }
  for (uint32_t slice = 0; slice < 2; ++slice) {
    auto done = std::make_shared<absl::Notification>();
    shard.Watch(slice, 1, [done](bool) { done->Notify(); });
    ASSERT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("scope=\"model\""));
  const auto m = ParseMetrics(text);
  EXPECT_EQ(MetricValue(m, "ps_model_rounds_total"), 1);
  EXPECT_EQ(MetricValue(m, "ps_model_rounds_dropped_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_rounds_closed_total"), 2);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"slice\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"model_gram\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"model_apply\"}"), 2);
  shard.SetAggregationObserver(nullptr);  // metrics goes first
}

TEST_F(MetricsTest, HistogramsCountObservationsIntoBuckets) {
  metrics_->ObservePush(std::chrono::microseconds(50), 100);     // le 0.0001
  metrics_->ObservePush(std::chrono::microseconds(700), 200);    // le 0.001
  metrics_->ObservePush(std::chrono::milliseconds(2000), 300);   // above every bucket
  metrics_->ObservePull(std::chrono::milliseconds(3));
  metrics_->ObservePullBytes(1000);
  metrics_->ObservePullBytes(24);
  const auto m = Scrape();
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_count"), 3);
  EXPECT_NEAR(MetricValue(m, "ps_push_duration_seconds_sum"), 2.00075, 1e-9);
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_bucket{le=\"0.0001\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_bucket{le=\"0.001\"}"), 2);
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_bucket{le=\"1\"}"), 2);
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_bucket{le=\"+Inf\"}"), 3);
  EXPECT_EQ(MetricValue(m, "ps_received_bytes_total{transport=\"tcp\"}"), 600);
  EXPECT_EQ(MetricValue(m, "ps_pull_duration_seconds_count"), 1);
  EXPECT_EQ(MetricValue(m, "ps_pull_duration_seconds_bucket{le=\"0.0025\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_pull_duration_seconds_bucket{le=\"0.005\"}"), 1);
  EXPECT_EQ(MetricValue(m, "ps_sent_bytes_total{transport=\"tcp\"}"), 1024);
}

TEST_F(MetricsTest, CheckpointAgeAppearsOnceSet) {
  metrics_->SetCheckpointTime(std::chrono::system_clock::now() - std::chrono::seconds(30));
  const auto m = Scrape();
  const double age = MetricValue(m, "ps_checkpoint_age_seconds");
  EXPECT_GE(age, 30);
  EXPECT_LT(age, 90);
}

TEST_F(MetricsTest, UdpDropsByReasonAndDatagramBytes) {
  ShardFront front(shard_.get(), nullptr, nullptr);
  auto udp = transport::udp::Receiver::Start("127.0.0.1", 0, 1 << 20, 1, &front);
  ASSERT_TRUE(udp.ok()) << udp.status();
  Metrics metrics(shard_.get());
  metrics.SetBackends({udp->get()});
  EXPECT_EQ((*udp)->Handle("not a datagram").code(), absl::StatusCode::kInvalidArgument);
  const auto m = ParseMetrics(metrics.Render());
  EXPECT_EQ(MetricValue(m, "ps_received_bytes_total{transport=\"udp\"}"), 14);
  EXPECT_EQ(MetricValue(m, "ps_udp_datagrams_dropped_total{reason=\"malformed\"}"), 1);
  for (const char* reason : {"unknown_session", "forged", "replayed", "stale", "refused"}) {
    EXPECT_EQ(MetricValue(m, absl::StrCat("ps_udp_datagrams_dropped_total{reason=\"", reason,
                                          "\"}")),
              0)
        << reason;
  }
  EXPECT_EQ(MetricValue(m, "ps_udp_chunks_accepted_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_udp_chunks_lost_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_udp_chunks_held_from_before_total"), 0);
}

// Fake port stats: every series reads its field, one per port, nothing counted twice.
TEST_F(MetricsTest, PortsConnectionsCallsAndWatchesFromTheirStats) {
  // No port source: no port series.
  EXPECT_THAT(metrics_->Render(), Not(HasSubstr("ps_connections_")));
  EXPECT_THAT(metrics_->Render(), Not(HasSubstr("{port=\"")));

  PortStats main;
  main.port = "main";
  main.listener.accepted = 40;
  main.listener.table = {.open = 7, .unproven = 5, .proven = 2};
  for (size_t i = 0; i < main.listener.closed.size(); ++i) main.listener.closed[i] = 100 + i;
  main.front.budget = {.clients = 3, .calls = 9, .reading = 4, .waiting = 2};
  main.front.refused_calls = 11;
  main.front.stalled = 12;
  main.front.reset_connections = 4242;  // the listener's closes are the series
  main.health_watches = 6;
  PortStats health;
  health.port = "health";
  health.listener.accepted = 1;
  health.listener.table = {.open = 1, .unproven = 1, .proven = 0};
  health.front.budget = {.clients = 1, .calls = 1, .reading = 0, .waiting = 0};
  health.health_watches = 1;
  int calls = 0;
  metrics_->SetPortSource([&] {
    ++calls;
    return std::vector<PortStats>{main, health};
  });

  const std::string text = metrics_->Render();
  EXPECT_EQ(calls, 1);
  const std::pair<const char*, const char*> types[] = {
      {"ps_connections_open", "gauge"},          {"ps_connections_accepted_total", "counter"},
      {"ps_connections_closed_total", "counter"}, {"ps_calls_open", "gauge"},
      {"ps_request_bodies_receiving", "gauge"},  {"ps_request_bodies_waiting", "gauge"},
      {"ps_calls_refused_total", "counter"},     {"ps_health_watches_open", "gauge"}};
  for (const auto& [family, type] : types) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# TYPE ", family, " ", type, "\n")));
  }
  const auto m = ParseMetrics(text);
  const std::pair<const char*, double> expected[] = {
      {"ps_connections_open{port=\"main\",state=\"unproven\"}", 5},
      {"ps_connections_open{port=\"main\",state=\"proven\"}", 2},
      {"ps_connections_open{port=\"health\",state=\"unproven\"}", 1},
      {"ps_connections_open{port=\"health\",state=\"proven\"}", 0},
      {"ps_connections_accepted_total{port=\"main\"}", 40},
      {"ps_connections_accepted_total{port=\"health\"}", 1},
      {"ps_calls_open{port=\"main\"}", 9},
      {"ps_calls_open{port=\"health\"}", 1},
      {"ps_request_bodies_receiving{port=\"main\"}", 4},
      {"ps_request_bodies_waiting{port=\"main\"}", 2},
      {"ps_request_bodies_waiting{port=\"health\"}", 0},
      {"ps_calls_refused_total{port=\"main\",reason=\"over_limit\"}", 11},
      {"ps_calls_refused_total{port=\"main\",reason=\"stalled\"}", 12},
      {"ps_calls_refused_total{port=\"health\",reason=\"stalled\"}", 0},
      {"ps_health_watches_open{port=\"main\"}", 6},
      {"ps_health_watches_open{port=\"health\"}", 1},
      // The shard's refusals are its own count (the server reports the front's refusals
      // to it); the port stats do not add to them.
      {"ps_refusals_total{reason=\"stalled\"}", 0},
      {"ps_refusals_total{reason=\"over_limit\"}", 0}};
  for (const auto& [series, value] : expected) EXPECT_EQ(MetricValue(m, series), value) << series;
  for (size_t i = 0; i < static_cast<size_t>(CloseReason::kCount); ++i) {
    const std::string reason(CloseReasonName(static_cast<CloseReason>(i)));
    EXPECT_NE(reason, "unknown");
    for (const auto& [port, value] :
         {std::pair<std::string, double>{"main", static_cast<double>(100 + i)},
          std::pair<std::string, double>{"health", 0}}) {
      const std::string series = absl::StrCat("ps_connections_closed_total{port=\"", port,
                                              "\",reason=\"", reason, "\"}");
      EXPECT_EQ(MetricValue(m, series), value) << series;
    }
  }
  // Rapid resets are the listener's closes (reason "resets" above), counted once: the
  // front's own count of them is no series.
  for (const auto& [series, value] : m) EXPECT_NE(value, 4242) << series;

  // Read at every scrape.
  main.front.budget.calls = 1;
  EXPECT_EQ(MetricValue(Scrape(), "ps_calls_open{port=\"main\"}"), 1);
  EXPECT_EQ(calls, 2);

  // Detached: the series go, the source is no longer called.
  metrics_->SetPortSource(nullptr);
  EXPECT_THAT(metrics_->Render(), Not(HasSubstr("ps_connections_")));
  EXPECT_EQ(calls, 2);
}

TEST_F(MetricsTest, ServesTheTextOverHttpAndStops) {
  ASSERT_TRUE(metrics_->Serve("127.0.0.1", 0).ok());
  const uint16_t port = metrics_->port();
  ASSERT_NE(port, 0);
  EXPECT_EQ(metrics_->Serve("127.0.0.1", 0).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<net::testing::HttpResponse> r = net::testing::HttpGet(port, "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(MetricValue(ParseMetrics(r->body), "ps_ready"), 1);
  // The operator's page beside it: HTML, one row per worker.
  absl::StatusOr<net::testing::HttpResponse> page = net::testing::HttpGet(port, "/status");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->head, HasSubstr("Content-Type: text/html; charset=utf-8"));
  EXPECT_THAT(page->body, HasSubstr("<tr><td class=\"id\">0</td><td>present</td>"));
  EXPECT_THAT(page->body,
              HasSubstr("<tr class=\"absent\"><td class=\"id\">1</td><td>never joined</td>"));
  EXPECT_EQ(page->body, metrics_->RenderStatus());
  EXPECT_EQ(net::testing::HttpGet(port, "/nothing")->status, 404);
  metrics_->Stop();
  EXPECT_EQ(metrics_->port(), 0);
  EXPECT_FALSE(net::testing::HttpGet(port, "/metrics").ok());
  metrics_->Stop();  // idempotent
}

TEST_F(MetricsTest, ServeFailsOnAPortInUse) {
  net::testing::ListeningSocket taken;
  ASSERT_NE(taken.port(), 0);
  absl::Status st = metrics_->Serve("127.0.0.1", taken.port());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("cannot serve metrics"));
  EXPECT_EQ(metrics_->port(), 0);
}

}  // namespace
}  // namespace ps::server
