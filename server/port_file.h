// The --port-file format: the port a shard serves on, as decimal digits and a newline,
// written whole (through a temporary file and a rename) once the shard serves. The
// shard writes it here and launchers read it here (harness/server_process.h, the demo),
// so the two sides cannot drift apart.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ps::server {

// Writes `port` to `path` through `path`.tmp and a rename, so that a reader sees the
// whole number or nothing.
inline absl::Status WritePortFile(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.good()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// The port in the file at `path`; nullopt while it does not exist or does not hold a
// port (1-65535) and nothing else.
inline std::optional<uint16_t> ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  uint32_t port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) || port == 0 || port > 65535) {
    return std::nullopt;
  }
  return static_cast<uint16_t>(port);
}

}  // namespace ps::server
