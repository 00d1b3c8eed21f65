// Compressed-domain aggregation support (docs/codecs.md, "Compressed-domain
// aggregation"): when every push of a slice shares a structure, a shard can aggregate
// without expanding the payloads.
//
// - Random-k with a global seed: every worker keeps the same coordinates, so the rule
//   runs on the k kept coordinates only (the rest are zero in every input).
// - Sign: a majority vote runs on the packed sign bits directly.
// - 3lc: the plain mean is made from each payload's digits, a byte per value, instead of
//   a decoded row of floats each.
//
// Each must give exactly what the dense path gives on the decoded values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ps::codecs {

// The coordinates a random-k payload keeps, as a function of a seed: equal supports
// mean equal index sets for the same slice size.
struct SeededSupport {
  uint64_t mask_seed = 0;
  uint32_t k = 0;
  friend bool operator==(const SeededSupport&, const SeededSupport&) = default;
};

// The support of a random-k payload, read from its header without decoding values;
// nullopt for a payload that is not random-k or whose header is malformed (a shard
// calls this only on payloads its decoder accepted).
std::optional<SeededSupport> SeededSupportOf(std::string_view randk_payload);

// The sorted kept indices of `support` over `numel` coordinates: exactly the ones the
// random-k decoder fills. Requires k <= numel.
std::vector<uint32_t> SupportIndices(const SeededSupport& support, size_t numel);

// Sign majority vote over sign-codec payloads (all for `out.size()` values, each
// already accepted by the sign decoder), computed on the packed bits. Writes what the
// dense rule `sign_majority` gives on the decoded rows:
//   scale   = median over rows of mean_j |x_ij| (midpoint of the two middle ones for
//             an even count; for a sign payload that is its scale),
//   vote_j  = #{i: x_ij > 0} - #{i: x_ij < 0},
//   out_j   = scale * sign(vote_j)  (0 on a tie).
// A payload with scale 0 decodes to zeros and so votes for neither sign.
absl::Status SignMajorityVote(std::span<const std::string_view> sign_payloads,
                              std::span<float> out);

// Values Mean3lc also hands back: payload j's decoded values at coordinates t * stride,
// t < count, into rows[j][t] (one row per payload; count 0: none).
struct ValueSamples {
  size_t count = 0;
  size_t stride = 0;
  std::span<float* const> rows;
};

// The mean of k >= 1 3lc payloads (each for `out.size()` values and already accepted by
// the 3lc decoder) into out, as the rule `mean` computes it on the decoded rows
// (aggregators' AverageInputs), bit for bit: ((x_0 + x_1) + ... + x_{k-1}) / k, each x_j
// the decoded value t x M_j, the division a product by 1 / k where k is a power of two.
// Each payload is decoded into its digits, a byte per value in the calling thread's
// scratch, and one pass over them makes the mean; no row of floats is written. A
// payload the decoder refuses is refused with its message (out is then unspecified).
absl::Status Mean3lc(std::span<const std::string_view> payloads, std::span<float> out,
                     const ValueSamples& samples = {});

}  // namespace ps::codecs
