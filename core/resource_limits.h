// The CPUs and memory this process may use (docs/operations.md, "Sizing"): the
// machine's, bounded by the limits of the process's cgroup and its ancestors, as a
// container runtime sets them (Kubernetes' resources.limits, Docker's --cpus and
// --memory, systemd's CPUQuota= and MemoryMax=, Slurm's cgroup plugins).
//
//  - cgroup v2 (the "0::PATH" line of /proc/self/cgroup): cpu.max ("QUOTA PERIOD" or
//    "max PERIOD") and memory.max ("max" or bytes) of /sys/fs/cgroup/PATH and of every
//    ancestor up to /sys/fs/cgroup;
//  - cgroup v1 (the "N:...cpu...:PATH" and "N:...memory...:PATH" lines): cpu.cfs_quota_us
//    (-1: none) over cpu.cfs_period_us in the cpu hierarchy, memory.limit_in_bytes in the
//    memory one, for PATH and its ancestors (a hierarchy mounted at
//    /sys/fs/cgroup/CONTROLLERS, e.g. cpu,cpuacct).
//
// CPUs are the quota rounded up (1.5 CPUs: 2 threads), at least 1, at most the machine's;
// memory the smallest limit, at most the machine's. Files that are missing or unreadable
// mean no limit. Reads a few small files; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace ps::core {

struct ResourceLimits {
  unsigned cpus = 1;
  uint64_t memory_bytes = 0;
  // Where each came from: "the machine", or the cgroup file ("cgroup v2 /sys/fs/cgroup/
  // kubepods/.../cpu.max: 150000 100000").
  std::string cpus_from;
  std::string memory_from;
};

// `root` prefixes every path read ("" is the real file system; tests pass a tree of
// their own). `machine_cpus` and `machine_memory` are the bounds (0: this machine's).
ResourceLimits ReadResourceLimits(const std::string& root = "", unsigned machine_cpus = 0,
                                  uint64_t machine_memory = 0);

// ReadResourceLimits(), read once per process.
const ResourceLimits& ProcessResourceLimits();

}  // namespace ps::core
