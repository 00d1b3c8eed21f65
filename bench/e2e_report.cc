#include "bench/e2e_report.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::bench {

namespace {

// Bytes a round moves: per worker, 4 x params pushed and 4 x params pulled.
double BytesPerRound(int workers, uint64_t params) {
  return double(workers) * double(params) * 4 * 2;
}

}  // namespace

double GoodputGbps(int workers, uint64_t params, const E2eResult& e2e) {
  return BytesPerRound(workers, params) * e2e.rounds * 8 / 1e9 / e2e.seconds;
}

Table ComparisonTable() {
  return Table({"workers", "shards", "codec", "aggregator", "f", "plane", "rounds",
                "goodput Gbit/s", "vs mean", "vs grpc", "raw TCP Gbit/s", "ratio", "1-copy/raw",
                "vs 1-copy", "pull s/round", "push s/round", "round p50 s", "round p99 s",
                "e2e GB/cpu-s", "raw GB/cpu-s", "RSS B/param"});
}

void AddComparisonRow(const E2eFlags& f, const ComparisonRow& r, Table& table,
                      std::vector<cli::JsonObjectWriter>& json) {
  const double bytes_per_round = BytesPerRound(r.workers, r.params);
  const double raw_bytes = bytes_per_round * r.raw_rounds;
  const double raw_gbps = raw_bytes * 8 / 1e9 / r.raw.seconds;
  const double raw_per_cpu = raw_bytes / 1e9 / r.raw.cpu_seconds;
  const double one_copy_gbps = raw_bytes * 8 / 1e9 / r.one_copy.seconds;
  const E2eResult& e2e = r.e2e;
  const double goodput = GoodputGbps(r.workers, r.params, e2e);
  const double e2e_per_cpu = bytes_per_round * e2e.rounds / 1e9 / e2e.cpu_seconds;
  const double rss_per_param = double(r.rss_kib) * 1024 / double(r.params);
  const std::string plane(core::DataPlaneName(r.plane));
  const std::string shown =
      f.pull_codec.empty() ? r.codec : absl::StrCat(r.codec, " / pull ", f.pull_codec);
  table.AddRow({absl::StrCat(r.workers), absl::StrCat(r.shards), shown, RuleLabel(r.rule),
                r.rule.spec.empty() ? "-" : absl::StrCat(r.rule.byzantine), plane,
                absl::StrCat(e2e.rounds), FormatG(goodput, 4),
                r.vs_mean.has_value() ? FormatG(*r.vs_mean, 3) : "-",
                r.vs_grpc.has_value() ? FormatG(*r.vs_grpc, 3) : "-", FormatG(raw_gbps, 4),
                FormatG(goodput / raw_gbps, 3), FormatG(one_copy_gbps / raw_gbps, 3),
                FormatG(goodput / one_copy_gbps, 3), FormatG(e2e.pull_seconds, 3),
                FormatG(e2e.push_seconds, 3), FormatG(e2e.round_p50, 3),
                FormatG(e2e.round_p99, 3), FormatG(e2e_per_cpu, 3), FormatG(raw_per_cpu, 3),
                FormatG(rss_per_param, 3)});
  cli::JsonObjectWriter row;
  row.Add("workers", r.workers)
      .Add("shards", r.shards)
      .Add("model_params", r.params)
      .Add("codec", r.codec)
      .Add("goodput_gbps", goodput)
      .Add("raw_tcp_gbps", raw_gbps)
      .Add("ratio", goodput / raw_gbps)
      .Add("one_copy_tcp_gbps", one_copy_gbps)
      .Add("one_copy_ratio", one_copy_gbps / raw_gbps)
      .Add("vs_one_copy", goodput / one_copy_gbps)
      .Add("data_plane", plane)
      .Add("tls", f.tls)
      .Add("tcp_rto_min_ms", f.tcp_rto_min_ms)
      .Add("rounds", e2e.rounds)
      .Add("warmup_rounds", f.warmup)
      .Add("seconds", e2e.seconds)
      .Add("raw_tcp_rounds", r.raw_rounds)
      .Add("raw_tcp_seconds", r.raw.seconds)
      .Add("pull_seconds_per_round", e2e.pull_seconds)
      .Add("push_seconds_per_round", e2e.push_seconds)
      .Add("cpu_seconds", e2e.cpu_seconds)
      .Add("raw_tcp_cpu_seconds", r.raw.cpu_seconds)
      .Add("aggregate_only", f.aggregate_only)
      .Add("borrow", f.borrow)
      .Add("error_feedback", f.error_feedback)
      .Add("momentum", f.momentum)
      .Add("pull_codec", f.pull_codec)
      .Add("round_seconds_p50", e2e.round_p50)
      .Add("round_seconds_p99", e2e.round_p99)
      .Add("rss_bytes_per_param", rss_per_param)
      .Add("aggregator", r.rule.spec)
      .Add("repeats", f.repeats);
  // With --shards-at the running shards chose the rule, f and scope.
  if (!r.rule.spec.empty()) {
    row.Add("num_byzantine", r.rule.byzantine).Add("aggregation_scope", f.aggregation_scope);
  }
  if (r.vs_mean.has_value()) row.Add("vs_mean", *r.vs_mean);
  if (r.vs_grpc.has_value()) row.Add("vs_grpc", *r.vs_grpc);
  json.push_back(std::move(row));
}

}  // namespace ps::bench
