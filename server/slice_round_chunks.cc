// SliceRound's chunked (UDP) pushes: a datagram's chunk and a push's end
// (server/slice_round.h, docs/transport.md "Closing a round at the workers' ends").
#include <chrono>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/refusal.h"
#include "server/decode_budget.h"
#include "server/slice_round.h"

namespace ps::server {

using core::Refusal;
using core::Refused;

absl::StatusOr<SliceRound::Progress> SliceRound::AcceptChunk(const Chunk& c, std::string_view codec,
                                                             DecoderFn decoder,
                                                             std::string_view payload) {
  Locked lock(this);
  if (absl::Status st = CheckOpenRoundLocked(c.worker, c.round); !st.ok()) return st;
  ChunkedPush& push = inputs_.chunked[c.worker];
  // Built only for a refusal.
  auto what = [&] {
    return absl::StrCat("chunk ", c.index, " of ", c.count_in_push, " from worker ", c.worker,
                        " for round ", c.round, " of slice ", info_.id);
  };
  if (push.chunk_count == 0 && inputs_.pushed[c.worker]) {
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("chunk from worker ", c.worker, " for round ", c.round,
                                " of slice ", info_.id, ", which it already pushed over gRPC"));
  }
  if (push.chunk_count != 0 && push.chunk_elems != c.chunk_elems) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("malformed ", what(), ": chunk size ", c.chunk_elems,
                                " after chunks of ", push.chunk_elems, " in the same push"));
  }
  if (push.chunk_count != 0 && push.seen[c.index] != 0) {
    if (c.session != push.sessions[push.seen[c.index] - 1]) {
      return Progress{.held_from_before = true};
    }
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("replayed chunk ", c.index, " from worker ", c.worker,
                                " for round ", c.round, " of slice ", info_.id));
  }
  // The session's place in push.sessions (a new one is added once the chunk is taken).
  size_t session_at = 0;
  if (push.chunk_count != 0) {
    while (session_at < push.sessions.size() && push.sessions[session_at] != c.session) {
      ++session_at;
    }
    if (session_at == ChunkedPush::kMaxSessions) {
      return Refused(Refusal::kMalformed,
                     absl::StrCat(what(), " under its ", ChunkedPush::kMaxSessions + 1,
                                  "th UDP session in one round: at most ",
                                  ChunkedPush::kMaxSessions));
    }
  }
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> decoded_by = decoder();
  if (!decoded_by.ok()) return decoded_by.status();
  const std::span<float> slot = SlotLocked(c.worker, c.first, c.count);
  const std::chrono::nanoseconds decode_start = DecodeBudget::ThreadCpuNow();
  if (absl::Status st = (*decoded_by)->Decode(payload, slot); !st.ok()) {
    return Refused(Refusal::kMalformed, absl::StrCat("malformed ", what(), ": codec ",
                                                     core::ClientText(codec), ": ", st.message()));
  }
  if (push.chunk_count == 0) {
    push.chunk_elems = c.chunk_elems;
    push.chunk_count = c.count_in_push;
    push.received = 0;
    push.seen.assign(c.count_in_push, 0);
    push.sessions.clear();
    inputs_.pushed[c.worker] = 1;
    ++num_pushed_;
    // Chunks never share a support or carry a whole sign payload: aggregate decoded.
    inputs_.supports[c.worker] = std::nullopt;
    if (rules_->keep_signs) inputs_.sign_payloads[c.worker].clear();
  }
  const std::chrono::nanoseconds decode = DecodeBudget::ThreadCpuNow() - decode_start;
  if (session_at == push.sessions.size()) push.sessions.push_back(c.session);
  push.seen[c.index] = static_cast<uint8_t>(session_at + 1);
  if (++push.received == push.chunk_count) {
    ++num_complete_;
    // A chunk that came after its push's end (reordered on the way).
    if (push.ended) --num_ended_;
  }
  absl::StatusOr<Progress> progress = AfterPushLocked();
  if (progress.ok()) progress->decode = decode;
  return progress;
}

absl::StatusOr<SliceRound::Progress> SliceRound::AcceptEnd(const PushEnd& e) {
  Locked lock(this);
  if (absl::Status st = CheckOpenRoundLocked(e.worker, e.round); !st.ok()) return st;
  ChunkedPush& push = inputs_.chunked[e.worker];
  if (push.chunk_count == 0 && inputs_.pushed[e.worker]) {
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("end of a UDP push from worker ", e.worker, " for round ", e.round,
                                " of slice ", info_.id, ", which it pushed over gRPC"));
  }
  if (push.chunk_count != 0 &&
      (push.chunk_elems != e.chunk_elems || push.chunk_count != e.count_in_push)) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("malformed end of a UDP push from worker ", e.worker,
                                " for round ", e.round, " of slice ", info_.id, ": ",
                                e.count_in_push, " chunks of ", e.chunk_elems, " after chunks of ",
                                push.chunk_elems, ", ", push.chunk_count, " of them"));
  }
  Progress p;
  if (push.ended) return p;
  push.ended = true;
  push.end_count = e.count_in_push;
  const bool whole = push.chunk_count != 0 && push.received == push.chunk_count;
  if (!whole) ++num_ended_;
  return AfterPushLocked();
}

}  // namespace ps::server
