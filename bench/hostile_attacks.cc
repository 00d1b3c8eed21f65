#include "bench/hostile_attacks.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#if PS_HAVE_DATA_PORT_CLIENT
#include "bench/hostile_data_phases.h"
#endif

namespace ps::bench {

#if PS_HAVE_DATA_PORT_CLIENT
namespace {

// The data_* attacks (hostile_data_phases.h) as attacks of this catalogue: their
// control reads worker 3's data session and counts on the attack's tally.
void AddDataPortAttacks(std::vector<Attack>& attacks) {
  for (DataPortAttack& a : DataPortAttacks()) {
    auto run = [run = std::move(a.run)](AttackEnv& env, int thread) {
      DataPortControl c;
      c.target = [&env] { return env.attacker->data_target(); };
      c.more = [&env] { return env.more(); };
      c.stopped = [&env] { return env.stop->load(); };
      c.max_connections = env.limits->raw_connections;
      c.refused = [&env](const absl::Status& s) {
        env.tally->Count(grpc::Status(static_cast<grpc::StatusCode>(s.code()), ""));
      };
      c.unanswered = [&env](uint64_t n) { env.tally->CountOther(n); };
      c.accepted = [&env](std::string what) { env.tally->Accepted(std::move(what)); };
      c.note = [&env](std::string note) { env.tally->Note(std::move(note)); };
      run(c, thread);
    };
    attacks.push_back({.name = std::move(a.name),
                       .what = std::move(a.what),
                       .threads = a.threads,
                       .run = std::move(run),
                       .tcp_data_plane = true});
  }
}

}  // namespace
#endif

std::vector<Attack> AllAttacks() {
  std::vector<Attack> attacks;
  attacks.push_back({"layout_wrap",
                     "RegisterLayout of one tensor of 2^64-1 elements in slices of 2^22, in a loop",
                     2, LayoutWrap, /*before_layout=*/true});
  attacks.push_back({"layout_huge",
                     "RegisterLayout of 2^24 and of 2^20 slices of one element, in a loop", 2,
                     LayoutHuge, /*before_layout=*/true});
  attacks.push_back(
      {"layout_tensors",
       "RegisterLayout of 2^16 tensors with 100-byte names (7 MB) after the layout exists, "
       "--inflight at once",
       1, LayoutTensors});
  attacks.push_back(
      {"big_messages",
       "pushes with 7 MiB payloads, --inflight at once (the bytes of layout_tensors without the "
       "tensors)",
       1, BigMessages});
  attacks.push_back({"anon_messages",
                     "big_messages without a token: a client that cannot authenticate at all", 1,
                     AnonMessages});
  attacks.push_back(
      {"codec_poison",
       "pushes for the open round under ever new codec specs with garbage payloads; worker 3's "
       "own valid pushes use new specs too",
       2, CodecPoison, false, /*poison_cover=*/true});
  attacks.push_back(
      {"pull_leak",
       "batches of 64 far-future pulls with a 50 ms deadline, and pulls that never read, held "
       "to their deadline",
       2, PullLeak, false, false, PullSlotsFree});
  attacks.push_back(
      {"impersonation",
       "Join, Push, Pull, PeerService and AdminService calls as others: no token, worker 3's, "
       "forged ones, ones derived from another secret",
       2, Impersonation});
  attacks.push_back(
      {"log_flood",
       "Join in a loop with worker 3's token, joins as workers out of range, invalid UTF-8 in "
       "string fields",
       2, LogFlood});
  attacks.push_back(
      {"junk_requests",
       "InitSlice of wrong sizes, Pull of 100,000 slice ids, a 1 MiB codec spec, round 2^64-1, "
       "worker 2^32-1, 9 MiB messages",
       1, JunkRequests});
  attacks.push_back({"udp_quorum",
                     "one datagram per slice as each round opens, nothing more of worker 3's "
                     "push (runs without the cover)",
                     1, UdpQuorum, false, false, nullptr, /*without_cover=*/true});
  attacks.push_back({"pull_slices", "pulls naming 7.6 million slice ids (7.6 MB), 8 in flight",
                     1, PullSlices});
  attacks.push_back(
      {"conn_flood",
       "connections that make one call and stay open, and TCP connections that never speak", 2,
       ConnFlood});
#if PS_HAVE_DATA_PORT_CLIENT
  AddDataPortAttacks(attacks);
#endif
#if PS_HAVE_H2_ATTACKER
  AddH2Attacks(attacks);
#endif
  return attacks;
}

}  // namespace ps::bench
