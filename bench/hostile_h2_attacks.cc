// The h2_* attacks of `ps-bench hostile`, below the messages: HTTP/2 frames as the
// hostile client of the tests sends them (tests/support/h2_attacker.h; hostile_attacks.h;
// docs/bench.md, "Hostile clients"). Each runs until its phase ends, within its own
// bounds (not --quick's request budget), and counts the streams it opened, or the frames
// or connections where it opens none. Built with the tests (PS_BUILD_TESTS).
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/hostile_attacks.h"
#include "tests/support/h2_attacker.h"

namespace ps::bench {

using std::chrono::milliseconds;

namespace {

namespace h2 = ps::testing::h2;

h2::Control H2Control(const AttackEnv& env) {
  return {.stop = [stop = env.stop] { return stop->load(); }, .duration = std::chrono::hours(1)};
}

h2::Request H2Push(const AttackEnv& env, bool with_token) {
  return {.path = std::string(h2::kPushPath),
          .authorization = with_token ? AttackerProofs::Get().Header(env.attacker->token()) : ""};
}

void H2Count(AttackEnv& env, const h2::Report& r) {
  env.tally->CountOther(r.streams > 0 ? r.streams : r.frames > 0 ? r.frames : r.connections);
  env.tally->Note(r.Summary());
}

h2::Report H2Flood(AttackEnv& env, h2::FloodKind kind, h2::Request request, bool read_replies) {
  h2::FloodOptions o;
  o.target.port = env.attacker->port();
  o.kind = kind;
  o.request = std::move(request);
  o.max_connections = 1000;
  o.max_frames = 100000000;
  o.frames_per_write = 128;
  o.read_replies = read_replies;
  o.control = H2Control(env);
  return h2::Flood(o);
}

// `attack` again and again, each time for up to `each` with the next of `variants`
// options, until the phase ends.
template <typename Options>
h2::Report H2InTurns(AttackEnv& env, std::vector<Options> variants, milliseconds each,
                     h2::Report (*attack)(const Options&)) {
  h2::Report all;
  for (size_t i = 0; !env.stop->load(); ++i) {
    Options o = variants[i % variants.size()];
    o.target.port = env.attacker->port();
    o.control = H2Control(env);
    o.control.duration = each;
    all.Add(attack(o));
  }
  return all;
}

}  // namespace

void AddH2Attacks(std::vector<Attack>& attacks) {
  const auto add = [&](std::string name, std::string what,
                       std::function<h2::Report(AttackEnv&)> attack, bool without_cover = false) {
    attacks.push_back({.name = std::move(name),
                       .what = std::move(what),
                       .run = [attack](AttackEnv& env, int) { H2Count(env, attack(env)); },
                       .without_cover = without_cover,
                       .by_name = true});
  };
  const auto flood = [](h2::FloodKind kind, bool read, bool token, std::string_view path) {
    return [=](AttackEnv& env) {
      h2::Request request = H2Push(env, token);
      request.path = std::string(path);
      return H2Flood(env, kind, std::move(request), read);
    };
  };
  // Worker 3's half-sent bodies hold its own reads (4 at once) until
  // --request-read-timeout-ms cuts them, and its other pushes wait behind them: the cover's
  // too, so with a cover the rounds would wait for worker 3 as if it pushed nothing. It
  // runs without one: the rounds wait for the deadline in both phases, and the ratio
  // shows what the attack costs the honest workers.
  add(
      "h2_half_sent",
      "40 Push streams on one connection, each 1 byte short of its 8 MiB message, held (runs "
      "without the cover)",
      [](AttackEnv& env) {
        h2::HalfSentOptions o;
        o.target.port = env.attacker->port();
        o.request = H2Push(env, true);
        o.control = H2Control(env);
        return h2::HalfSentRequests(o);
      },
      /*without_cover=*/true);
  add("h2_rapid_reset", "HEADERS of a Push with worker 3's token and RST_STREAM at once, repeated",
      flood(h2::FloodKind::kRapidReset, true, true, h2::kPushPath));
  add("h2_rapid_reset_anon", "h2_rapid_reset without a token",
      flood(h2::FloodKind::kRapidReset, true, false, h2::kPushPath));
  add("h2_watch_reset", "h2_rapid_reset of Health/Watch (no token needed)",
      flood(h2::FloodKind::kRapidReset, true, false, h2::kHealthWatchPath));
  add("h2_ping_flood", "PINGs as fast as they go, a new connection when one is closed",
      flood(h2::FloodKind::kPing, true, false, h2::kPushPath));
  add("h2_settings_flood", "SETTINGS frames as fast as they go, the ACKs never read",
      flood(h2::FloodKind::kSettings, false, false, h2::kPushPath));
  add("h2_window_update_flood", "WINDOW_UPDATEs of 1 byte on the connection",
      flood(h2::FloodKind::kWindowUpdate, true, false, h2::kPushPath));
  add("h2_hpack_bomb",
      "HPACK: a 4 KB table entry referenced 16,000 times per request, 100 headers of 4 KB, a 1 "
      "MB header, in turns",
      [](AttackEnv& env) {
        std::vector<h2::HpackOptions> kinds(3);
        kinds[0].kind = h2::HpackKind::kIndexedReferences;
        kinds[1].kind = h2::HpackKind::kManyLargeHeaders;
        kinds[2].kind = h2::HpackKind::kOversizedHeader;
        kinds[2].header_bytes = 1u << 20;
        for (h2::HpackOptions& o : kinds) {
          o.request = H2Push(env, true);
          o.max_bytes = 32u << 20;
        }
        return H2InTurns(env, kinds, milliseconds(1000), &h2::HpackBomb);
      });
  add("h2_continuation",
      "HEADERS without END_HEADERS, then CONTINUATION frames (16 KB literals, or empty) up to "
      "64 MB a connection",
      [](AttackEnv& env) {
        std::vector<h2::ContinuationOptions> variants(2);
        variants[1].empty_frames = true;
        for (h2::ContinuationOptions& o : variants) {
          o.request = H2Push(env, true);
          o.max_connections = 1;
        }
        return H2InTurns(env, variants, milliseconds(1000), &h2::ContinuationFlood);
      });
  add("h2_health_watches", "40,000 Health/Watch streams without a token on 10 connections, held",
      [](AttackEnv& env) {
        h2::HealthWatchOptions o;
        o.target.port = env.attacker->port();
        o.connections = 10;
        o.streams_per_connection = 4000;
        o.control = H2Control(env);
        return h2::HealthWatches(o);
      });
  add("h2_health_bodies", "Health/Check calls without a token with 8 MB bodies, 4 at a time",
      [](AttackEnv& env) {
        h2::HealthCheckBodyOptions o;
        o.target.port = env.attacker->port();
        o.max_calls = 100000;
        o.control = H2Control(env);
        return h2::HealthCheckBodies(o);
      });
}

}  // namespace ps::bench
