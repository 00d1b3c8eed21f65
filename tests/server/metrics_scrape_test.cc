// A real Server with --metrics-port 0 on loopback, one real round with a real
// ps::Worker, then /metrics scraped over HTTP: values, and `promtool check metrics` on
// the body when promtool is installed (Debian package prometheus; run.sh installs it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/net/metrics_text.h"
#include "tests/support/h2_attacker.h"
#include "server/server.h"
#include "worker_lib/metrics.h"
#include "worker_lib/worker.h"

namespace ps::server {
namespace {

namespace h2 = ::ps::testing::h2;

using ::testing::HasSubstr;
using ::testing::Not;
using net::testing::MetricValue;
using net::testing::ParseMetrics;
using std::chrono::milliseconds;

constexpr char kPromtool[] = "/usr/bin/promtool";

// On gRPC's data plane, whose calls these tests count on the main port; the TCP plane's
// series: MetricsDataPlaneScrapeTest.
ServerOptions Options() {
  ServerOptions o;
  o.data_plane = core::DataPlane::kGrpc;
  o.insecure = true;
  o.host = "127.0.0.1";
  o.port = 0;
  o.udp_port = 0;
  o.metrics_port = 0;
  o.num_workers = 1;
  o.threads = 2;
  o.round_deadline = milliseconds(20000);
  o.drain_timeout = milliseconds(2000);
  return o;
}

// Runs `promtool check metrics` on `text`; returns its exit status and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string stem = absl::StrCat("ps-metrics-", ::getpid());
  const std::filesystem::path in = dir / (stem + ".prom");
  const std::filesystem::path out = dir / (stem + ".out");
  std::ofstream(in) << text;
  const std::string cmd = absl::StrCat("timeout 60 ", kPromtool, " check metrics < ", in.string(),
                                       " > ", out.string(), " 2>&1");
  const int rc = std::system(cmd.c_str());
  std::ifstream read(out);
  std::string output((std::istreambuf_iterator<char>(read)), std::istreambuf_iterator<char>());
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, output};
}

class MetricsScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = Server::Start(Options());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_NE(server_->metrics_port(), 0);
    ASSERT_NE(server_->metrics_port(), server_->port());
    ASSERT_NE(server_->metrics(), nullptr);
  }

  std::string Scrape() {
    absl::StatusOr<net::testing::HttpResponse> r =
        net::testing::HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(r->status, 200);
    return r->body;
  }

  std::unique_ptr<Server> server_;
};

TEST_F(MetricsScrapeTest, OneRealRoundShowsInTheScrapeAndPassesPromtool) {
  const core::ModelLayout layout =
      *core::ModelLayout::Create({{"w", 300, 0}, {"b", 10, 1}}, /*slice_elems=*/128, 1);
  std::vector<std::vector<float>> init = {std::vector<float>(300, 0.5f),
                                          std::vector<float>(10, 0.0f)};
  WorkerOptions wo;
  wo.shard_addresses = {absl::StrCat("127.0.0.1:", server_->port())};
  wo.connect_timeout = milliseconds(20000);
  const std::vector<std::span<const float>> initial(init.begin(), init.end());
  auto worker = Worker::Start(wo, layout, initial);
  ASSERT_TRUE(worker.ok()) << worker.status();

  std::vector<std::vector<float>> params = {std::vector<float>(300), std::vector<float>(10)};
  std::vector<std::span<float>> outs(params.begin(), params.end());
  ASSERT_TRUE((*worker)->PullAll(0, outs, milliseconds(20000)).ok());
  for (size_t t = 0; t < 2; ++t) {
    ASSERT_TRUE((*worker)->Push(t, 0, std::vector<float>(layout.tensors()[t].numel, 1.0f)).ok());
  }
  ASSERT_TRUE((*worker)->WaitPushes().ok());
  auto v = (*worker)->PullAll(1, outs, milliseconds(20000));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(*v, 1u);

  // The worker has every slice once the last write is out; the server ends the stream
  // (and times it) just after: wait (bounded) for both pulls to be counted.
  std::string body = Scrape();
  for (int i = 0; i < 500 && ParseMetrics(body)["ps_pull_duration_seconds_count"] < 2; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    body = Scrape();
  }
  const auto m = ParseMetrics(body);
  const double slices = static_cast<double>(layout.slices().size());
  const double values = 310;
  EXPECT_EQ(MetricValue(m, "ps_ready"), 1);
  EXPECT_EQ(MetricValue(m, "ps_workers_joined"), 1);
  EXPECT_EQ(MetricValue(m, "ps_published_version"), 1);
  EXPECT_EQ(MetricValue(m, "ps_pushes_accepted_total"), slices);
  EXPECT_EQ(MetricValue(m, "ps_rounds_closed_total"), slices);
  EXPECT_EQ(MetricValue(m, "ps_push_duration_seconds_count"), slices);
  EXPECT_EQ(MetricValue(m, "ps_aggregation_duration_seconds_count{stage=\"slice\"}"), slices);
  EXPECT_EQ(MetricValue(m, "ps_push_decoded_bytes_total"), values * 4);
  // Nothing refused: every gRPC push byte received was accepted.
  EXPECT_EQ(MetricValue(m, "ps_received_bytes_total{transport=\"grpc\"}"),
            MetricValue(m, "ps_push_wire_bytes_total"));
  EXPECT_GE(MetricValue(m, "ps_push_wire_bytes_total"), values * 4);
  EXPECT_EQ(MetricValue(m, "ps_received_bytes_total{transport=\"udp\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_udp_datagrams_dropped_total{reason=\"forged\"}"), 0);
  for (int r = 0; r < static_cast<int>(Refusal::kCount); ++r) {
    EXPECT_EQ(
        MetricValue(m, absl::StrCat("ps_refusals_total{reason=\"",
                                    std::string(RefusalName(static_cast<Refusal>(r))), "\"}")),
        0);
  }
  // Two PullAll calls, each streaming every slice (a stream ends when its last slice
  // is written, so both are counted by now).
  EXPECT_GE(MetricValue(m, "ps_pull_duration_seconds_count"), 2);
  EXPECT_GE(MetricValue(m, "ps_sent_bytes_total{transport=\"grpc\"}"), 2 * values * 4);
  EXPECT_THAT(body, HasSubstr("ps_shard_info{"));
  // The worker's connections proved themselves with their first call; no health port,
  // so no series of one.
  EXPECT_GE(MetricValue(m, "ps_connections_open{port=\"main\",state=\"proven\"}"), 1);
  EXPECT_GE(MetricValue(m, "ps_connections_accepted_total{port=\"main\"}"), 1);
  EXPECT_THAT(body, Not(HasSubstr("{port=\"health\"")));

  // The worker's own series (worker_lib/metrics.h), as a trainer serves them.
  const std::vector<std::string> names = {"w", "b"};
  const std::string worker_text = WorkerMetricsText((*worker)->stats(), names);
  const auto w = ParseMetrics(worker_text);
  EXPECT_EQ(MetricValue(w, "ps_worker_slices_pushed_total"), slices);
  EXPECT_EQ(MetricValue(w, "ps_worker_slices_refused_total"), 0);
  EXPECT_EQ(MetricValue(w, "ps_worker_slices_pulled_total"), 2 * slices);
  EXPECT_GE(MetricValue(w, "ps_worker_push_bytes_total"), values * 4);
  EXPECT_EQ(MetricValue(w, "ps_worker_plans_total"), 0);
  EXPECT_EQ(w.count("ps_worker_link_transfers{shard=\"0\",direction=\"push\"}"), 1u);
  EXPECT_EQ(w.count("ps_worker_link_transfers{shard=\"0\",direction=\"pull\"}"), 1u);

  server_->metrics()->SetCheckpointTime(std::chrono::system_clock::now());
  const std::string with_checkpoint = Scrape();
  EXPECT_GE(MetricValue(ParseMetrics(with_checkpoint), "ps_checkpoint_age_seconds"), 0);

  if (!std::filesystem::exists(kPromtool)) {
    GTEST_SKIP() << kPromtool << " not found (Debian package prometheus; `bash run.sh test` "
                 << "installs it): the exposition format was not linted";
  }
  for (const std::string& text : {body, with_checkpoint, worker_text}) {
    const auto [rc, output] = Promtool(text);
    EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << output << "\non:\n" << text;
  }
}

// A shard on the TCP data plane: a worker's round moves its bytes under
// transport="tcp", and the data port's connection series follow its one connection;
// the exposition still passes promtool.
TEST(MetricsDataPlaneScrapeTest, TheTcpPlanesBytesAndConnectionsShow) {
  ServerOptions o = Options();
  o.data_plane = core::DataPlane::kTcp;
  auto server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 300, 0}}, 128, 1);
  const std::vector<float> init(300, 0.5f);
  WorkerOptions wo;
  wo.shard_addresses = {absl::StrCat("127.0.0.1:", (*server)->port())};
  wo.connect_timeout = milliseconds(20000);
  wo.data_plane = core::DataPlane::kTcp;
  const std::vector<std::span<const float>> initial = {init};
  auto worker = Worker::Start(wo, layout, initial);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<float> params(300);
  const std::vector<std::span<float>> outs = {params};
  ASSERT_TRUE((*worker)->Push(0, 0, std::vector<float>(300, 1.0f)).ok());
  ASSERT_TRUE((*worker)->WaitPushes().ok());
  ASSERT_TRUE((*worker)->PullAll(1, outs, milliseconds(20000)).ok());
  const auto scrape = [&] {
    absl::StatusOr<net::testing::HttpResponse> r =
        net::testing::HttpGet((*server)->metrics_port(), "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->body : std::string();
  };
  std::string body = scrape();
  for (int i = 0; i < 500 && ParseMetrics(body)["ps_pull_duration_seconds_count"] < 1; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    body = scrape();
  }
  const auto m = ParseMetrics(body);
  EXPECT_EQ(MetricValue(m, "ps_data_connections_accepted_total"), 1);
  EXPECT_EQ(MetricValue(m, "ps_data_connections_admitted_total"), 1);
  EXPECT_EQ(MetricValue(m, "ps_data_connections_refused_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_data_connections_open"), 1);
  EXPECT_EQ(MetricValue(m, "ps_received_bytes_total{transport=\"tcp\"}"),
            MetricValue(m, "ps_push_wire_bytes_total"));
  EXPECT_GE(MetricValue(m, "ps_received_bytes_total{transport=\"tcp\"}"), 300 * 4);
  EXPECT_GE(MetricValue(m, "ps_sent_bytes_total{transport=\"tcp\"}"), 300 * 4);
  EXPECT_EQ(m.count("ps_received_bytes_total{transport=\"grpc\"}"), 0u);
  worker->reset();  // its connection closes: the gauge follows (bounded wait)
  for (int i = 0; i < 500 && MetricValue(ParseMetrics(body), "ps_data_connections_open") != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    body = scrape();
  }
  EXPECT_EQ(MetricValue(ParseMetrics(body), "ps_data_connections_open"), 0);
  if (!std::filesystem::exists(kPromtool)) GTEST_SKIP() << kPromtool << " not found";
  const auto [rc, output] = Promtool(body);
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << output << "\non:\n" << body;
}

// Connections, calls and watches on both ports, from a hostile HTTP/2 client
// (tests/support/h2_attacker.h): the gauges follow what is open, the counters what the
// listeners and fronts ended, and the exposition still passes promtool.
TEST(MetricsPortsScrapeTest, ConnectionsCallsAndWatchesMoveWithTheClients) {
  ServerOptions o = Options();
  o.health_port = 0;
  o.max_calls_per_client = 2;
  o.max_reads_per_client = 1;
  o.connection_proof_timeout = milliseconds(4000);
  o.request_read_timeout = milliseconds(4000);
  auto started = Server::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<Server> server = *std::move(started);
  ASSERT_NE(server->health_port(), 0);
  // Connections that never send (not even an answer to the server's SETTINGS), and
  // HTTP/2 clients, whose frames are read and answered at every scrape.
  std::vector<std::unique_ptr<h2::Connection>> silent, clients;
  auto scrape = [&] {
    for (auto& c : clients) (void)c->Poll(milliseconds(0));
    absl::StatusOr<net::testing::HttpResponse> r =
        net::testing::HttpGet(server->metrics_port(), "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->body : std::string();
  };
  // Scrapes until every series of `expected` has its value, at most `wait`; then checks
  // them and returns the last body.
  using Expected = std::vector<std::pair<std::string, double>>;
  auto scrape_until = [&](milliseconds wait, const Expected& expected) {
    auto matches = [&](const std::map<std::string, double>& m) {
      return std::all_of(expected.begin(), expected.end(), [&](const auto& e) {
        auto it = m.find(e.first);
        return it != m.end() && it->second == e.second;
      });
    };
    const auto until = std::chrono::steady_clock::now() + wait;
    std::string body = scrape();
    while (!matches(ParseMetrics(body)) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(20));
      body = scrape();
    }
    const auto m = ParseMetrics(body);
    for (const auto& [series, value] : expected) EXPECT_EQ(MetricValue(m, series), value) << series;
    return body;
  };

  Expected idle;
  for (const char* port : {"main", "health"}) {
    const std::string p = absl::StrCat("port=\"", port, "\"");
    for (const char* family : {"ps_calls_open", "ps_health_watches_open",
                               "ps_connections_accepted_total"}) {
      idle.emplace_back(absl::StrCat(family, "{", p, "}"), 0);
    }
    for (const char* state : {"unproven", "proven"}) {
      idle.emplace_back(absl::StrCat("ps_connections_open{", p, ",state=\"", state, "\"}"), 0);
    }
  }
  const std::string before = scrape_until(milliseconds(0), idle);

  // Main port: three connections that never send a byte (unproven), and one that
  // proves itself (--insecure: with its first call) and opens three half-sent pushes:
  // the first is read, the second waits (one read per client), the third is over the
  // two calls a client may have open.
  h2::Target main_port{.port = server->port()};
  for (int i = 0; i < 3; ++i) {
    auto bare = h2::Connection::Open({.target = main_port, .handshake = false});
    ASSERT_TRUE(bare.ok()) << bare.status();
    silent.push_back(*std::move(bare));
  }
  auto pusher = h2::Connection::Open({.target = main_port});
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  const std::string push = h2::RequestHeaderBlock({.path = std::string(h2::kPushPath)});
  for (int i = 0; i < 3; ++i) {
    const uint32_t id = (*pusher)->NextStream();
    ASSERT_TRUE((*pusher)->Headers(id, push, /*end_stream=*/false).ok());
    ASSERT_TRUE((*pusher)->DataNow(id, h2::GrpcPrefix(1000), /*end_stream=*/false).ok());
  }
  clients.push_back(*std::move(pusher));
  // Health port: one Watch (the connection stays unproven: health carries no identity).
  auto watcher = h2::Connection::Open({.target = {.port = server->health_port()}});
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  const uint32_t watch = (*watcher)->NextStream();
  ASSERT_TRUE((*watcher)
                  ->Headers(watch,
                            h2::RequestHeaderBlock({.path = std::string(h2::kHealthWatchPath)}),
                            /*end_stream=*/false)
                  .ok());
  ASSERT_TRUE((*watcher)
                  ->Data(watch, h2::GrpcMessage(h2::HealthCheckRequestBytes("")),
                         /*end_stream=*/true, milliseconds(2000))
                  .ok());
  clients.push_back(*std::move(watcher));

  const std::string during = scrape_until(
      milliseconds(3000),
      {{"ps_connections_open{port=\"main\",state=\"unproven\"}", 3},
       {"ps_connections_open{port=\"main\",state=\"proven\"}", 1},
       {"ps_connections_accepted_total{port=\"main\"}", 4},
       {"ps_calls_open{port=\"main\"}", 2},
       {"ps_request_bodies_receiving{port=\"main\"}", 1},
       {"ps_request_bodies_waiting{port=\"main\"}", 1},
       {"ps_calls_refused_total{port=\"main\",reason=\"over_limit\"}", 1},
       {"ps_calls_refused_total{port=\"main\",reason=\"stalled\"}", 0},
       // The front's refusal is the shard's too, counted once there.
       {"ps_refusals_total{reason=\"over_limit\"}", 1},
       {"ps_health_watches_open{port=\"main\"}", 0},
       {"ps_connections_open{port=\"health\",state=\"unproven\"}", 1},
       {"ps_connections_open{port=\"health\",state=\"proven\"}", 0},
       {"ps_connections_accepted_total{port=\"health\"}", 1},
       {"ps_calls_open{port=\"health\"}", 1},
       {"ps_health_watches_open{port=\"health\"}", 1},
       {"ps_request_bodies_waiting{port=\"health\"}", 0}});

  // After the proof timeout (4 s) the unproven connections are closed (the watch with its
  // connection); after the read timeout (4 s) the first push is cancelled as stalled and
  // the second one is read (it stalls 4 s later).
  const std::string after = scrape_until(
      milliseconds(15000),
      {{"ps_connections_closed_total{port=\"main\",reason=\"proof_timeout\"}", 3},
       {"ps_connections_closed_total{port=\"health\",reason=\"proof_timeout\"}", 1},
       {"ps_connections_closed_total{port=\"main\",reason=\"resets\"}", 0},
       {"ps_connections_open{port=\"main\",state=\"unproven\"}", 0},
       {"ps_connections_open{port=\"main\",state=\"proven\"}", 1},
       {"ps_connections_open{port=\"health\",state=\"unproven\"}", 0},
       {"ps_health_watches_open{port=\"health\"}", 0},
       {"ps_calls_open{port=\"health\"}", 0},
       {"ps_calls_open{port=\"main\"}", 1},
       {"ps_request_bodies_receiving{port=\"main\"}", 1},
       {"ps_request_bodies_waiting{port=\"main\"}", 0},
       {"ps_calls_refused_total{port=\"main\",reason=\"stalled\"}", 1},
       {"ps_refusals_total{reason=\"stalled\"}", 1}});

  silent.clear();
  clients.clear();
  server->Shutdown();
  if (!std::filesystem::exists(kPromtool)) GTEST_SKIP() << kPromtool << " not found";
  for (const std::string& text : {before, during, after}) {
    const auto [rc, output] = Promtool(text);
    EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << output << "\non:\n" << text;
  }
}

// A plan's codecs as labels, escaped; large counters exact.
TEST(WorkerMetricsTest, PlanCodecsAreEscapedLabelsAndCountersExact) {
  WorkerStats s;
  s.push_bytes = 14653652400;  // beyond 6 significant digits
  s.push_links = {LinkStats{.alpha_seconds = 1e-3, .seconds_per_byte = 4e-7, .transfers = 9},
                  LinkStats{}};
  s.pull_links = {LinkStats{.alpha_seconds = 0, .seconds_per_byte = 8e-7, .transfers = 5},
                  LinkStats{}};
  s.plan.plans = 2;
  s.plan.planned_at = 7;
  s.plan.predicted_seconds = 0.25;
  s.plan.codecs = {"topk(0.01)+varint+fp16", "fp32"};
  s.plan.devices = {core::Device::kCuda, core::Device::kCpu};
  const std::vector<std::string> names = {"fc1.weight", "odd \"name\"\\"};
  EXPECT_EQ(PlanChoicesText(s.plan, names),
            "fc1.weight=topk(0.01)+varint+fp16@cuda, odd \"name\"\\=fp32");
  const std::string text = WorkerMetricsText(s, names);
  EXPECT_THAT(text, HasSubstr("ps_worker_push_bytes_total 14653652400\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_link_seconds_per_byte{shard=\"0\",direction=\"push\"} "
                              "3.9999999999999998e-07\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_link_transfers{shard=\"0\",direction=\"push\"} 9\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_link_seconds_per_byte{shard=\"0\",direction=\"pull\"} "
                              "7.9999999999999996e-07\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_link_transfers{shard=\"1\",direction=\"pull\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_plan_codec{tensor=\"fc1.weight\","
                              "codec=\"topk(0.01)+varint+fp16\",device=\"cuda\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_plan_codec{tensor=\"odd \\\"name\\\"\\\\\","
                              "codec=\"fp32\",device=\"cpu\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_worker_plan_round 7\n"));
  if (!std::filesystem::exists(kPromtool)) GTEST_SKIP() << kPromtool << " not found";
  const auto [rc, output] = Promtool(text);
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << output << "\non:\n" << text;
}

TEST_F(MetricsScrapeTest, OtherPathsAreNotFoundAndShutdownStopsServing) {
  absl::StatusOr<net::testing::HttpResponse> r =
      net::testing::HttpGet(server_->metrics_port(), "/nope");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  const uint16_t port = server_->metrics_port();
  server_->Shutdown();
  EXPECT_EQ(server_->metrics_port(), 0);
  EXPECT_FALSE(net::testing::HttpGet(port, "/metrics").ok());
}

// The security finding fixed by HttpEndpoint: with prometheus-cpp's Exposer (civetweb,
// two threads) two clients that sent half a request blocked every scrape for about 30 s.
TEST_F(MetricsScrapeTest, HalfSentRequestsDoNotBlockTheScrape) {
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(server_->metrics_port());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string half = "GET /metrics HTTP/1.1\r\n";
    ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(half.size()));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string body = Scrape();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  const auto m = ParseMetrics(body);
  EXPECT_EQ(MetricValue(m, "ps_ready"), 0);
  // The 20 idle connections and the scrape's own (the idle ones may still be in the
  // accept queue: at least the scrape's).
  EXPECT_GE(MetricValue(m, "ps_metrics_http_open_connections"), 1);
  EXPECT_LE(MetricValue(m, "ps_metrics_http_open_connections"), 21);
  EXPECT_GE(MetricValue(m, "ps_metrics_http_connections_total"), 1);
  EXPECT_EQ(MetricValue(m, "ps_metrics_http_connections_closed_total{reason=\"evicted\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_metrics_http_connections_closed_total{reason=\"timed_out\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_metrics_http_requests_total{result=\"served\"}"), 0);
  EXPECT_EQ(MetricValue(m, "ps_metrics_http_requests_total{result=\"refused\"}"), 0);
  for (const int fd : idle) ::close(fd);
}

TEST(MetricsServerTest, NoEndpointByDefault) {
  ServerOptions o = Options();
  o.metrics_port = -1;
  auto server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->metrics_port(), 0);
  EXPECT_EQ((*server)->metrics(), nullptr);
}

TEST(MetricsServerTest, StartFailsWhenTheMetricsPortIsTaken) {
  net::testing::ListeningSocket taken;
  ASSERT_NE(taken.port(), 0);
  ServerOptions o = Options();
  o.metrics_port = taken.port();
  auto server = Server::Start(o);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("metrics"));
}

}  // namespace
}  // namespace ps::server
