#include "core/resource_limits.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ps::core {
namespace {

std::optional<std::string> ReadSmall(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  return std::string(absl::StripAsciiWhitespace(text));
}

// `dir`, then each ancestor up to and including `top` ("/sys/fs/cgroup/a/b", "/sys/fs/
// cgroup/a", "/sys/fs/cgroup").
std::vector<std::string> UpTo(const std::string& top, const std::string& path) {
  std::vector<std::string> dirs;
  std::string p(absl::StripSuffix(path, "/"));
  while (true) {
    dirs.push_back(top + p);
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos || p.empty()) break;
    p.resize(slash);
  }
  return dirs;
}

struct Cgroups {
  std::optional<std::string> v2;      // PATH of "0::PATH"
  std::optional<std::string> cpu;     // v1: the cpu hierarchy's mount name and PATH
  std::string cpu_mount;
  std::optional<std::string> memory;  // v1: the memory hierarchy's
  std::string memory_mount;
};

Cgroups ReadCgroups(const std::string& root) {
  Cgroups c;
  std::ifstream in(root + "/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) {
      c.v2 = parts[2];
      continue;
    }
    for (const std::string& controller : std::vector<std::string>(absl::StrSplit(parts[1], ','))) {
      if (controller == "cpu") {
        c.cpu = parts[2];
        c.cpu_mount = parts[1];
      } else if (controller == "memory") {
        c.memory = parts[2];
        c.memory_mount = parts[1];
      }
    }
  }
  return c;
}

// The directory of a v1 hierarchy: /sys/fs/cgroup/cpu,cpuacct, else /sys/fs/cgroup/cpu.
std::string V1Mount(const std::string& root, const std::string& controllers,
                    const std::string& fallback) {
  const std::string named = root + "/sys/fs/cgroup/" + controllers;
  if (std::ifstream(named + "/cgroup.procs")) return named;
  return root + "/sys/fs/cgroup/" + fallback;
}

}  // namespace

ResourceLimits ReadResourceLimits(const std::string& root, unsigned machine_cpus,
                                  uint64_t machine_memory) {
  if (machine_cpus == 0) machine_cpus = std::max(1u, std::thread::hardware_concurrency());
  if (machine_memory == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    machine_memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 4ull << 30;
  }
  ResourceLimits r;
  double cpus = machine_cpus;
  r.memory_bytes = machine_memory;
  r.cpus_from = r.memory_from = "the machine";
  const auto cpu_limit = [&](double quota, double period, const std::string& from) {
    if (quota > 0 && period > 0 && quota / period < cpus) {
      cpus = quota / period;
      r.cpus_from = from;
    }
  };
  const auto memory_limit = [&](const std::string& text, const std::string& from) {
    uint64_t bytes = 0;
    if (absl::SimpleAtoi(text, &bytes) && bytes > 0 && bytes < r.memory_bytes) {
      r.memory_bytes = bytes;
      r.memory_from = from;
    }
  };
  const Cgroups c = ReadCgroups(root);
  if (c.v2.has_value()) {
    for (const std::string& dir : UpTo(root + "/sys/fs/cgroup", *c.v2)) {
      if (std::optional<std::string> max = ReadSmall(dir + "/cpu.max")) {
        std::vector<std::string> f = absl::StrSplit(*max, ' ', absl::SkipEmpty());
        double quota = 0, period = 0;
        if (f.size() == 2 && absl::SimpleAtod(f[0], &quota) && absl::SimpleAtod(f[1], &period)) {
          cpu_limit(quota, period, absl::StrCat("cgroup v2 ", dir, "/cpu.max: ", *max));
        }
      }
      if (std::optional<std::string> max = ReadSmall(dir + "/memory.max")) {
        memory_limit(*max, absl::StrCat("cgroup v2 ", dir, "/memory.max: ", *max));
      }
    }
  }
  if (c.cpu.has_value()) {
    for (const std::string& dir : UpTo(V1Mount(root, c.cpu_mount, "cpu"), *c.cpu)) {
      std::optional<std::string> quota = ReadSmall(dir + "/cpu.cfs_quota_us");
      std::optional<std::string> period = ReadSmall(dir + "/cpu.cfs_period_us");
      double q = 0, p = 0;
      if (quota && period && absl::SimpleAtod(*quota, &q) && absl::SimpleAtod(*period, &p)) {
        cpu_limit(q, p, absl::StrCat("cgroup v1 ", dir, "/cpu.cfs_quota_us: ", *quota, " of ",
                                     *period));
      }
    }
  }
  if (c.memory.has_value()) {
    for (const std::string& dir : UpTo(V1Mount(root, c.memory_mount, "memory"), *c.memory)) {
      if (std::optional<std::string> limit = ReadSmall(dir + "/memory.limit_in_bytes")) {
        memory_limit(*limit, absl::StrCat("cgroup v1 ", dir, "/memory.limit_in_bytes: ", *limit));
      }
    }
  }
  r.cpus = std::clamp(static_cast<unsigned>(std::ceil(cpus - 1e-9)), 1u, machine_cpus);
  return r;
}

const ResourceLimits& ProcessResourceLimits() {
  static const ResourceLimits limits = ReadResourceLimits();
  return limits;
}

}  // namespace ps::core
