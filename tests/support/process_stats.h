// Figures of another process from /proc, for tests and benchmarks that watch a server
// they started: resident memory, open descriptors, CPU time. Each is 0 when the process
// or its file is gone.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace ps::testing {

// A "Name:   123 kB" line of /proc/PID/status in bytes ("VmRSS:", "VmHWM:").
inline uint64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size())) * 1024;
  }
  return 0;
}

inline uint64_t ResidentBytes(pid_t pid) { return StatusBytes(pid, "VmRSS:"); }

inline uint64_t OpenFds(pid_t pid) {
  std::error_code ec;
  uint64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

// User and system CPU seconds so far (/proc/PID/stat fields 14 and 15).
inline double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t name_end = stat.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos) return 0;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string skip;
  for (int field = 3; field < 14 && fields >> skip; ++field) {
  }
  double utime = 0, stime = 0;
  fields >> utime >> stime;
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace ps::testing
