// The inputs of a slice's round (slice_round.h): what a push carries (PushPayload), and
// what a closed round hands its aggregation: the workers that pushed, their rows, the
// masks of UDP pushes with chunks missing, a support or sign bits they share for the
// compressed-domain paths, the chunks lost, and the median of the losses they reported.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "net/udp_frame.h"
#include "server/slice_round.h"

namespace ps::server {

size_t PushPayload::bytes() const {
  if (raw != nullptr) return 1 + size_t{raw->numel} * sizeof(float);
  size_t n = 0;
  for (std::string_view piece : pieces) n += piece.size();
  return n;
}

std::vector<uint32_t> ClosedRound::Workers() const {
  std::vector<uint32_t> workers;
  for (uint32_t w = 0; w < inputs.pushed.size(); ++w) {
    if (inputs.pushed[w]) workers.push_back(w);
  }
  return workers;
}

absl::StatusOr<std::vector<const float*>> ClosedRound::Rows(std::span<const uint32_t> workers,
                                                            RowScratch* scratch) {
  std::vector<const float*> rows;
  rows.reserve(workers.size());
  size_t scratch_rows = 0;
  for (uint32_t w : workers) {
    KeptPush* kept = w < inputs.kept.size() ? &inputs.kept[w] : nullptr;
    if (kept == nullptr || kept->payload.empty()) {
      rows.push_back(inputs.rows[w].get());
      continue;
    }
    std::span<float> into;
    if (scratch != nullptr) {
      into = scratch->Take(scratch_rows++, info.numel);
    } else {
      if (inputs.rows[w] == nullptr) inputs.rows[w] = std::make_unique<float[]>(info.numel);
      into = std::span<float>(inputs.rows[w].get(), info.numel);
    }
    if (absl::Status st = kept->codec->Decode(kept->payload, into); !st.ok()) {
      return absl::InternalError(absl::StrCat("slice ", info.id, ": worker ", w,
                                              "'s push passed its check and then failed to decode: ",
                                              st.message()));
    }
    if (scratch == nullptr) kept->payload.clear();  // decoded into its row for good
    rows.push_back(into.data());
  }
  return rows;
}

std::vector<std::string_view> ClosedRound::Kept3lc(std::span<const uint32_t> workers) const {
  std::vector<std::string_view> payloads;
  payloads.reserve(workers.size());
  for (uint32_t w : workers) {
    const KeptPush* kept = w < inputs.kept.size() ? &inputs.kept[w] : nullptr;
    if (kept == nullptr || kept->payload.empty() ||
        kept->codec->shared_structure() != codecs::SharedStructure::kTernaryDigits) {
      return {};
    }
    payloads.push_back(kept->payload);
  }
  return payloads;
}

InputMasks ClosedRound::MasksOf(std::span<const uint32_t> workers) const {
  InputMasks m;
  const uint32_t numel = info.numel;
  std::vector<size_t> partial;
  for (size_t i = 0; i < workers.size(); ++i) {
    const ChunkedPush& push = inputs.chunked[workers[i]];
    if (push.chunk_count == 0 || push.received == push.chunk_count) continue;
    partial.push_back(i);
    std::vector<uint8_t>& bits = m.bits.emplace_back((numel + 7) / 8, 0);
    for (uint32_t c = 0; c < push.chunk_count; ++c) {
      if (!push.seen[c]) continue;
      const net::ChunkRange r = net::ChunkRangeOf(numel, push.chunk_elems, c);
      for (uint32_t j = r.first; j < r.first + r.count; ++j) bits[j >> 3] |= uint8_t(1u << (j & 7));
    }
  }
  if (partial.empty()) return m;
  m.ptrs.assign(workers.size(), nullptr);
  for (size_t k = 0; k < partial.size(); ++k) m.ptrs[partial[k]] = m.bits[k].data();
  return m;
}

std::vector<uint32_t> ClosedRound::SharedSupport(std::span<const uint32_t> workers) const {
  if (workers.empty()) return {};
  const std::optional<codecs::SeededSupport>& first = inputs.supports[workers[0]];
  if (!first.has_value()) return {};
  for (uint32_t w : workers) {
    if (inputs.supports[w] != first) return {};
  }
  return codecs::SupportIndices(*first, info.numel);
}

std::vector<std::string_view> ClosedRound::Signs(std::span<const uint32_t> workers) const {
  std::vector<std::string_view> signs;
  if (inputs.sign_payloads.empty()) return signs;
  for (uint32_t w : workers) {
    if (inputs.sign_payloads[w].empty()) return {};
    signs.push_back(inputs.sign_payloads[w]);
  }
  return signs;
}

uint64_t ClosedRound::ChunksLost() const {
  uint64_t lost = 0;
  for (const ChunkedPush& push : inputs.chunked) {
    // A push none of whose chunks came lost all its end named; one without an end is
    // not known to have been sent.
    lost += push.chunk_count != 0 ? push.chunk_count - push.received
                                  : (push.ended ? push.end_count : 0);
  }
  return lost;
}

std::optional<float> MedianReported(const RoundInputs& inputs, const std::vector<float>& values) {
  std::vector<float> reported;
  for (size_t w = 0; w < inputs.pushed.size() && w < values.size(); ++w) {
    if (inputs.pushed[w] && !std::isnan(values[w])) reported.push_back(values[w]);
  }
  if (reported.empty()) return std::nullopt;
  const size_t mid = reported.size() / 2;
  std::nth_element(reported.begin(), reported.begin() + mid, reported.end());
  if (reported.size() % 2 == 1) return reported[mid];
  // Even: the mean of the two middle values (both within the honest range when fewer
  // than half the reporters lie).
  const float upper = reported[mid];
  const float lower = *std::max_element(reported.begin(), reported.begin() + mid);
  return lower + (upper - lower) / 2;
}

}  // namespace ps::server
