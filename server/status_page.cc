#include "server/status_page.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/refusal.h"

namespace ps::server {
namespace {

// Text as HTML element content or attribute value.
std::string Escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

uint64_t Refused(const WorkerCounts& w) {
  uint64_t n = 0;
  for (uint64_t r : w.refusals) n += r;
  return n;
}

}  // namespace

std::string WorkerMark(const WorkerCounts& w, Membership::State state, uint64_t rounds_closed) {
  if (w.refused(core::Refusal::kMalformed) > 0 || w.quarantines > 0 || w.suspicion.suspected) {
    return "suspect";
  }
  if (state != Membership::State::kPresent ||
      (rounds_closed > 0 && 2 * w.slice_rounds_missed > rounds_closed)) {
    return "absent";
  }
  return "";
}

std::string StatusPage(const StatusView& v) {
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"refresh\" content=\"5\">\n"
      "<title>ps-server shard ", v.shard_id, "</title>\n<style>\n"
      "body{font-family:sans-serif;margin:1.5em;color:#222;background:#fff}\n"
      "table{border-collapse:collapse;margin-top:1em}\n"
      "th,td{border:1px solid #bbb;padding:.3em .7em;text-align:right}\n"
      "th{background:#e8eef7}td.id{text-align:left}\n"
      "tr.suspect td{background:#f8d0d0}tr.absent td{background:#fbeec4}\n"
      "dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}\n"
      "dt{font-weight:bold}dd{margin:0}\n"
      "</style></head><body>\n",
      "<h1>ps-server shard ", v.shard_id, " of ", v.num_shards, "</h1>\n<dl id=\"shard\">\n",
      "<dt>state</dt><dd id=\"state\">", v.ready ? "ready" : "not ready (no model yet)",
      "</dd>\n<dt>rule</dt><dd>", Escape(v.aggregator), "</dd>\n",
      "<dt>published version</dt><dd>", v.min_version,
      v.max_version != v.min_version ? absl::StrCat(" to ", v.max_version) : std::string(),
      "</dd>\n<dt>slice rounds</dt><dd>", v.rounds_closed, "</dd>\n",
      "<dt>pushes accepted</dt><dd>", v.pushes_accepted, "</dd>\n",
      "<dt>refusals</dt><dd>", v.refusals, "</dd>\n</dl>\n");
  absl::StrAppend(&out,
                  "<table id=\"workers\">\n<caption>Workers (", v.workers_expected,
                  " expected): what this shard saw of their pushes</caption>\n"
                  "<tr><th>worker</th><th>state</th><th>pushes</th><th>UDP chunks</th>"
                  "<th>late</th><th>refused</th><th>malformed</th><th>slice rounds missed</th>"
                  "<th>quarantines</th><th>push latency</th><th>suspicion</th><th>mark</th>"
                  "</tr>\n");
  for (size_t i = 0; i < v.workers.size(); ++i) {
    const WorkerCounts& w = v.workers[i];
    const Membership::State state =
        i < v.states.size() ? v.states[i] : Membership::State::kNeverJoined;
    if (state == Membership::State::kSpare) continue;  // a spare id no one took yet
    const std::string mark = WorkerMark(w, state, v.rounds_closed);
    std::string state_text(MembershipStateName(state));
    for (char& c : state_text) c = c == '_' ? ' ' : c;
    absl::StrAppend(&out, "<tr", mark.empty() ? "" : absl::StrCat(" class=\"", mark, "\""),
                    "><td class=\"id\">", i, "</td><td>", state_text, "</td><td>",
                    w.pushes_accepted, "</td><td>", w.chunks_accepted, "</td><td>",
                    w.refused(core::Refusal::kLate), "</td><td>", Refused(w), "</td><td>",
                    w.refused(core::Refusal::kMalformed), "</td><td>", w.slice_rounds_missed,
                    "</td><td>", w.quarantines, "</td><td>",
                    w.pushes_accepted == 0
                        ? std::string("-")
                        : absl::StrFormat("%.0f ms", 1000 * w.push_latency_seconds /
                                                         static_cast<double>(w.pushes_accepted)),
                    "</td><td>",
                    std::isnan(w.suspicion.score) ? std::string("-")
                                                  : absl::StrFormat("%.2f", w.suspicion.score),
                    "</td><td>", mark, "</td></tr>\n");
  }
  absl::StrAppend(&out,
                  "</table>\n<p>Suspicion: how little the rule used the worker's pushes over "
                  "the last window of rounds, 0 (an equal share of the aggregates or more) to 1 "
                  "(never used). Marks: <b>suspect</b> after a malformed push or a quarantine, "
                  "or while its suspicion is at or above the threshold; "
                  "<b>absent</b> when it left, expired, never joined or missed more than half "
                  "of the slice rounds. A worker that left or expired is not waited for until "
                  "it pushes again. The same counts: <a href=\"/metrics\">/metrics</a> "
                  "(<code>ps_worker_*</code>). This page reloads every 5 seconds.</p>\n"
                  "</body></html>\n");
  return out;
}

}  // namespace ps::server
