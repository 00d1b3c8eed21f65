// Process-wide settings for a program that moves tensors at memory speed: the server,
// the tools, and trainers that opt in (docs/data_path.md, "Allocator").
//
// TuneProcessForThroughput():
// - glibc malloc keeps freed buffers of up to 32 MiB in its heap (M_MMAP_THRESHOLD) and
//   returns free memory to the system only once 512 MiB of it sits at the heap's top
//   (M_TRIM_THRESHOLD). Every message buffer (gRPC's reads, payloads, snapshots) is
//   then carved from pages already mapped, instead of mmap'ed afresh and faulted in
//   4 KiB at a time, which cost a shard as much as the bytes' copies did. The price is
//   resident memory that stays at its peak (bounded by the 512 MiB trim threshold
//   above the working set).
// - All threads allocate from one heap (M_ARENA_MAX 1) unless MALLOC_ARENA_MAX is set:
//   glibc unmaps a thread arena's sub-heap as soon as it empties, which ignores the trim
//   threshold and faulted every round's buffers in afresh.
// - abseil's mutex deadlock detection is turned off: Debian builds abseil with it on,
//   and it costs every contended lock a graph update (about 2 % of a shard's cycles).
//   Tests do not call this, so they keep it.
//
// Idempotent; call it early in main, before threads start. Thread safety: none needed
// before threads exist; later calls race with allocations only as mallopt allows.
#pragma once

namespace ps::cli {

void TuneProcessForThroughput();

}  // namespace ps::cli
