// Aggregator: a robust aggregation rule combining k gradient vectors of d floats into
// one (DESIGN §4). Rules are made by name through MakeAggregator(); the factory
// checks n and f against the rule's bound and says which bound failed.
//
// Ownership: Aggregate() borrows the inputs and the output for the call only.
// Thread safety: Aggregate() is const and may run concurrently for different slices.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/thread_pool.h"

namespace ps::aggregators {

// How many neighbours Krum scores over.
enum class KrumNeighbours {
  kPaper,  // n - f - 2, as in Blanchard et al. (the default)
  kByzFL,  // n - f - 1, as ByzFL computes it
};

// Coordinate-wise median for an even number of inputs.
enum class EvenMedian {
  kMidpoint,  // mean of the two middle values (the default)
  kLower,     // the lower middle value
  kUpper,     // the upper middle value
};

struct AggregatorOptions {
  // n: the number of workers, i.e. inputs when everyone pushes.
  int num_workers = 1;
  // f: the number of Byzantine workers tolerated.
  int num_byzantine = 0;
  // Multi-Krum: how many lowest-score inputs to average; 0 means k - f for k inputs.
  int multi_krum_m = 0;
  KrumNeighbours krum_neighbours = KrumNeighbours::kPaper;
  EvenMedian even_median = EvenMedian::kMidpoint;
};

// What a call aggregates beyond the vectors themselves.
struct AggregationContext {
  uint32_t slice_id = 0;
  uint64_t round = 0;
  // Threads to split coordinates over; nullptr runs on the calling thread. Results do
  // not depend on the pool's size.
  core::ThreadPool* pool = nullptr;
};

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // The rule's name as used in flags and config ("krum").
  virtual std::string_view name() const = 0;
  // Fewest inputs the rule accepts with the configured f (for example 2f + 3 for
  // Krum). A server checks its quorum against this at start-up.
  virtual int MinInputs() const = 0;
  // The bound as text, for messages: "n >= 2f + 3".
  virtual std::string_view Bound() const = 0;

  // Combines inputs (each pointing at out.size() floats) into out. Refuses fewer than
  // MinInputs() inputs. Inputs must be finite (the server checks at decode time).
  virtual absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                                 const AggregationContext& ctx) const = 0;

 protected:
  Aggregator() = default;
};

// Makes the rule named `name` (one of AggregatorNames()). Refuses an unknown name
// (listing the known ones), f < 0, and n below the rule's bound, with a message
// naming the bound ("krum needs n >= 2f + 3 = 9, got n = 8").
absl::StatusOr<std::unique_ptr<Aggregator>> MakeAggregator(std::string_view name,
                                                           const AggregatorOptions& options);

// Names accepted by MakeAggregator, in a stable order.
std::vector<std::string> AggregatorNames();

}  // namespace ps::aggregators
