#include "worker_lib/metrics.h"

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/device.h"

namespace ps {
namespace {

// One metric family: its HELP and TYPE lines, then samples.
class Family {
 public:
  Family(std::string* out, std::string_view name, std::string_view type, std::string_view help)
      : out_(out), name_(name) {
    for (std::string_view part : std::initializer_list<std::string_view>{
             "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n"}) {
      out_->append(part);
    }
  }
  // Counts print exactly, other values with 17 significant digits (both round-trip).
  Family& Sample(uint64_t value, std::string_view labels = {}) {
    return Line(absl::StrCat(value), labels);
  }
  Family& Sample(double value, std::string_view labels = {}) {
    return Line(absl::StrFormat("%.17g", value), labels);
  }

 private:
  Family& Line(std::string_view value, std::string_view labels) {
    out_->append(name_);
    if (!labels.empty()) out_->append("{").append(labels).append("}");
    out_->append(" ").append(value).append("\n");
    return *this;
  }

  std::string* out_;
  std::string_view name_;
};

void Counter(std::string* out, std::string_view name, std::string_view help, uint64_t value) {
  Family(out, name, "counter", help).Sample(value);
}

void Gauge(std::string* out, std::string_view name, std::string_view help, double value) {
  Family(out, name, "gauge", help).Sample(value);
}

core::Device DeviceOf(const PlanStats& plan, size_t tensor) {
  return tensor < plan.devices.size() ? plan.devices[tensor] : core::Device::kCpu;
}

}  // namespace

std::string PrometheusLabelValue(std::string_view value) {
  std::string out = "\"";
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

std::string WorkerMetricsText(const WorkerStats& s, std::span<const std::string> tensors) {
  std::string out;
  Counter(&out, "ps_worker_slices_pushed_total", "Pushed slices a shard accepted", s.slices_pushed);
  Counter(&out, "ps_worker_slices_borrowed_total",
          "Accepted pushed slices sent from the caller's buffer (PushOptions::borrow)",
          s.slices_borrowed);
  Counter(&out, "ps_worker_slices_held_from_before_total",
          "Accepted pushed slices of the round this process started at that the shard held "
          "already from the process of this worker id it replaced (restarted mid-round)",
          s.slices_held_from_before);
  Counter(&out, "ps_worker_slices_refused_total",
          "Pushed slices a shard refused (late, duplicate, invalid, over a budget, ...)",
          s.slices_refused);
  Counter(&out, "ps_worker_push_bytes_total", "Encoded payload bytes of accepted pushes",
          s.push_bytes);
  Counter(&out, "ps_worker_slices_pulled_total", "Slices pulled", s.slices_pulled);
  Counter(&out, "ps_worker_pull_bytes_total", "Payload bytes pulled", s.pull_bytes);
  Counter(&out, "ps_worker_slices_pulled_as_change_total",
          "Pulled slices a shard sent as a compressed change (--pull-codec)",
          s.slices_pulled_as_change);
  Counter(&out, "ps_worker_retries_total", "RPC attempts repeated", s.retries);
  Counter(&out, "ps_worker_pushes_replayed_total",
          "Accepted pushes sent again to a shard restarted from a checkpoint", s.pushes_replayed);
  Counter(&out, "ps_worker_udp_datagrams_sent_total", "Datagrams sent", s.udp_datagrams_sent);
  Counter(&out, "ps_worker_udp_datagrams_dropped_total", "Datagrams dropped by loss injection",
          s.udp_datagrams_dropped);
  Counter(&out, "ps_worker_udp_send_errors_total",
          "Datagrams the local kernel refused to send (lost like the network's losses)",
          s.udp_send_errors);
  Counter(&out, "ps_worker_udp_bytes_total", "Datagram bytes sent", s.udp_bytes);
  Counter(&out, "ps_worker_tcp_rto_min_unset_total",
          "TCP data connections opened without the shard's least retransmission timeout "
          "(this kernel cannot set it)",
          s.tcp_rto_min_unset);

  // Per shard and direction: the push window's busy periods, the pull streams'
  // back-to-back runs.
  const std::pair<const char*, const std::vector<LinkStats>*> directions[] = {
      {"push", &s.push_links}, {"pull", &s.pull_links}};
  auto per_link = [&](const char* name, const char* help, auto value) {
    Family family(&out, name, "gauge", help);
    for (const auto& [direction, links] : directions) {
      for (size_t i = 0; i < links->size(); ++i) {
        family.Sample(value((*links)[i]),
                      absl::StrCat("shard=\"", i, "\",direction=\"", direction, "\""));
      }
    }
  };
  per_link("ps_worker_link_alpha_seconds", "Measured fixed cost of a transfer to or from the shard",
           [](const LinkStats& l) { return l.alpha_seconds; });
  per_link("ps_worker_link_seconds_per_byte", "Measured cost per byte to or from the shard",
           [](const LinkStats& l) { return l.seconds_per_byte; });
  per_link("ps_worker_link_transfers",
           "Transfers the link estimate rests on (the last 64 at most)",
           [](const LinkStats& l) { return l.transfers; });

  const PlanStats& p = s.plan;
  Counter(&out, "ps_worker_plans_total", "Push plans made (--codec auto)", p.plans);
  Family(&out, "ps_worker_plan_round", "gauge", "The round the current plan was made at")
      .Sample(p.planned_at);
  Gauge(&out, "ps_worker_plan_predicted_seconds", "The current plan's simulated round",
        p.predicted_seconds);
  Gauge(&out, "ps_worker_plan_baseline_seconds", "The simulated round with fp32 everywhere",
        p.baseline_seconds);
  Gauge(&out, "ps_worker_round_measured_seconds",
        "Measured round, pull end to pull end (moving average; with a plan)", p.measured_seconds);
  Family codecs(&out, "ps_worker_plan_codec", "gauge",
                "1 for each tensor's push codec in the current plan");
  for (size_t t = 0; t < p.codecs.size() && t < tensors.size(); ++t) {
    codecs.Sample(uint64_t{1}, absl::StrCat("tensor=", PrometheusLabelValue(tensors[t]), ",codec=",
                                            PrometheusLabelValue(p.codecs[t]), ",device=\"",
                                            std::string(core::DeviceName(DeviceOf(p, t))), "\""));
  }
  return out;
}

std::string PlanChoicesText(const PlanStats& plan, std::span<const std::string> tensors) {
  std::string text;
  for (size_t t = 0; t < plan.codecs.size() && t < tensors.size(); ++t) {
    absl::StrAppend(&text, t == 0 ? "" : ", ", tensors[t], "=", plan.codecs[t],
                    DeviceOf(plan, t) == core::Device::kCuda ? "@cuda" : "");
  }
  return text;
}

}  // namespace ps
