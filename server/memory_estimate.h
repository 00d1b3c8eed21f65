// What a layout costs a shard in memory, estimated from the layout's summary alone so
// that a request naming a huge model is refused before anything is built
// (docs/operations.md, "Threat model and limits", has the formula).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/layout.h"
#include "server/options.h"

namespace ps::server {

// Estimated bytes a shard holds for a layout (parameters, velocity, published copies,
// the open round's pushes of every worker, per-slice bookkeeping, the layout's own
// tables); compared with --max-shard-bytes. `published_copies`: fp32-sized copies per
// element of published versions beyond one (the snapshot pool's spare buffers with
// dense pulls; with --pull-codec what the workers hold and each version's encoded
// change). `second_moment_elems`: the owned elements (an upper bound) of
// tensors whose optimizer keeps a second buffer (Adam's exp_avg_sq, optimizer.h), which
// checkpoints copy too. Saturates instead of overflowing.
uint64_t EstimateShardBytes(const core::LayoutSummary& layout, uint32_t num_workers,
                            size_t rule_state_rows, bool checkpoints, size_t published_copies = 0,
                            uint64_t second_moment_elems = 0);
// --max-shard-bytes with 0 resolved to half the physical memory.
uint64_t EffectiveMaxShardBytes(const ServerOptions& options);

}  // namespace ps::server
