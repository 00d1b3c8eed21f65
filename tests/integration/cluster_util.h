// Helpers for integration tests: in-process shards on ephemeral loopback ports, through
// server::LocalCluster (server/local_cluster.h), with its errors turned into test failures.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/data_plane.h"
#include "server/local_cluster.h"
#include "server/server.h"
#include "worker_lib/worker.h"

namespace ps::testing {

using Cluster = server::LocalCluster;

// `count` distinct TCP ports free on 127.0.0.1 a moment ago (server::PickFreePorts);
// none, and a test failure, when they could not be picked.
inline std::vector<uint16_t> PickFreePorts(size_t count) {
  absl::StatusOr<std::vector<uint16_t>> ports = server::PickFreePorts(count);
  EXPECT_TRUE(ports.ok()) << ports.status();
  return ports.value_or(std::vector<uint16_t>{});
}

// Starts `num_shards` shards on loopback, all with `base` options (server::LocalCluster::
// Start). A failure is a test failure and gives a cluster without shards.
inline Cluster StartCluster(uint32_t num_shards, server::ServerOptions base) {
  absl::StatusOr<Cluster> c = Cluster::Start(num_shards, std::move(base));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : Cluster();
}

// The token of worker `id` from the cluster's run directory ("" without one).
inline std::string WorkerToken(const Cluster& c, uint32_t id) {
  absl::StatusOr<std::string> token = c.WorkerToken(id);
  EXPECT_TRUE(token.ok()) << token.status();
  return token.value_or("");
}

// Options of a worker `id` of cluster `c`: its addresses and token, a generous connect
// timeout for busy machines.
inline WorkerOptions ClientOptions(const Cluster& c, uint32_t id) {
  WorkerOptions o;
  o.credentials.token = WorkerToken(c, id);
  o.shard_addresses = c.addresses();
  o.worker_id = id;
  o.connect_timeout = std::chrono::milliseconds(20000);
  return o;
}

// A deterministic gradient of worker `w` in round `r`, `n` sines of the element, worker
// and round, for tests that compare trained parameters with a reference.
inline std::vector<float> SineGradient(uint32_t w, uint64_t r, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.3f * static_cast<float>(i) + 1.1f * static_cast<float>(w) +
                    0.7f * static_cast<float>(r));
  }
  return g;
}

// Views of each worker's values, for the functions that take one span per worker.
inline std::vector<std::span<const float>> Spans(const std::vector<std::vector<float>>& v) {
  return {v.begin(), v.end()};
}

// The data planes a test runs over (docs/data-plane.md), for INSTANTIATE_TEST_SUITE_P;
// workers leave WorkerOptions::data_plane unset and follow the plane their Join answers
// name, so a test sets only ServerOptions::data_plane.
inline auto DataPlanes() {
  return ::testing::Values(core::DataPlane::kGrpc, core::DataPlane::kTcp);
}

// The test-name suffix of a plane ("grpc", "tcp").
inline std::string PlaneName(core::DataPlane plane) { return std::string(core::DataPlaneName(plane)); }

}  // namespace ps::testing
