// A worker's counters and its current plan as Prometheus text (exposition format 0.0.4,
// docs/metrics.md "Worker metrics"), for the training program to serve: ps-fashion-mnist
// --metrics-port serves it with net::HttpEndpoint, next to a few of its own series.
// Series: ps_worker_* counters of WorkerStats; per shard the push link's estimate
// (ps_worker_link_*{shard="i"}); the plan (PlanOptions): plans made, the round it was
// made at, its predicted, baseline and measured round seconds, and one
// ps_worker_plan_codec{tensor="...",codec="...",device="cpu|cuda"} 1 per tensor.
//
// Thread safety: a pure function.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "worker_lib/worker.h"

namespace ps {

// `tensors`: the layout's tensor names in order (the plan's codecs are per tensor).
std::string WorkerMetricsText(const WorkerStats& stats, std::span<const std::string> tensors);

// The plan's choices for a log line: "w=topk(0.01)+varint+fp16, b=fp32", a tensor
// encoded on the CUDA device marked "@cuda" ("w=fp16@cuda").
std::string PlanChoicesText(const PlanStats& plan, std::span<const std::string> tensors);

// `value` as a Prometheus label value between double quotes: backslash, double quote and
// line feed escaped.
std::string PrometheusLabelValue(std::string_view value);

}  // namespace ps
