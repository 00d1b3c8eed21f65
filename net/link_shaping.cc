// The link-shaping spec ("rate=20mbps,latency=5ms,burst=64k", shaper.h): parsing with
// errors that name the key, and the canonical description that parses back to it.
#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "net/shaper.h"

namespace ps::net {

using core::AsAbsl;

namespace {

constexpr uint64_t kDefaultBurstBytes = ShapingOptions{}.burst_bytes;
constexpr double kMinMbps = 1e-3;              // 1 kbit/s: below that waits overflow clocks
constexpr double kMaxMbps = 1e7;               // 10000 gbit/s
constexpr int64_t kMaxLatencyUs = 60'000'000;  // 60 s
constexpr uint64_t kMaxBurstBytes = uint64_t{1} << 30;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) {
    s.remove_prefix(1);
  }
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) {
    s.remove_suffix(1);
  }
  return s;
}

absl::Status ShapingError(std::string_view spec, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("link shaping '", AsAbsl(spec), "': ", AsAbsl(what)));
}

// "<key> '<value>': <why>", the fragment every value error starts with.
absl::Status ValueError(std::string_view key, std::string_view value, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(AsAbsl(key), " '", AsAbsl(value), "': ", AsAbsl(why)));
}

// Splits "1.5gbps" into 1.5 and "gbps" (lower-cased). from_chars takes the longest
// number, so exponents work ("1e3mbps") and "inf"/"nan" are caught as non-finite.
// A number and its unit, as NumberWithUnit splits them.
struct NumberUnit {
  double number = 0;
  std::string unit;
};

absl::Status NumberWithUnit(std::string_view key, std::string_view value, std::string_view units,
                            NumberUnit* out) {
  double number = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec == std::errc::result_out_of_range) return ValueError(key, value, "number out of range");
  if (ec != std::errc()) {
    return ValueError(key, value, absl::StrCat("not a number with a unit (", AsAbsl(units), ")"));
  }
  if (!std::isfinite(number)) return ValueError(key, value, "not a finite number");
  std::string unit =
      absl::AsciiStrToLower(AsAbsl(value.substr(static_cast<size_t>(end - value.data()))));
  if (unit.empty()) {
    return ValueError(key, value, absl::StrCat("missing unit (", AsAbsl(units), ")"));
  }
  out->number = number;
  out->unit = std::move(unit);
  return absl::OkStatus();
}

absl::StatusOr<double> ParseRateMbps(std::string_view key, std::string_view value) {
  NumberUnit parsed;
  PS_RETURN_IF_ERROR(NumberWithUnit(key, value, "kbps, mbps or gbps", &parsed));
  const double number = parsed.number;
  const std::string& unit = parsed.unit;
  double mbps = 0;
  // Divide for kbps (1e-3 is not exact) so that Describe's kbps form round-trips.
  if (unit == "kbps") {
    mbps = number / 1e3;
  } else if (unit == "mbps") {
    mbps = number;
  } else if (unit == "gbps") {
    mbps = number * 1e3;
  } else {
    return ValueError(key, value, absl::StrCat("unknown unit '", unit, "' (kbps, mbps or gbps)"));
  }
  if (!(mbps > 0)) return ValueError(key, value, "rate must be positive");
  if (mbps < kMinMbps) return ValueError(key, value, "rate must be at least 1kbps");
  if (mbps > kMaxMbps) return ValueError(key, value, "rate must be at most 10000gbps");
  return mbps;
}

absl::StatusOr<std::chrono::microseconds> ParseLatency(std::string_view key,
                                                       std::string_view value) {
  NumberUnit parsed;
  PS_RETURN_IF_ERROR(NumberWithUnit(key, value, "us, ms or s", &parsed));
  const double number = parsed.number;
  const std::string& unit = parsed.unit;
  double us = 0;
  if (unit == "us") {
    us = number;
  } else if (unit == "ms") {
    us = number * 1e3;
  } else if (unit == "s") {
    us = number * 1e6;
  } else {
    return ValueError(key, value, absl::StrCat("unknown unit '", unit, "' (us, ms or s)"));
  }
  if (us < 0 || std::signbit(us)) return ValueError(key, value, "latency must not be negative");
  if (us > static_cast<double>(kMaxLatencyUs)) {
    return ValueError(key, value, "latency must be at most 60s");
  }
  return std::chrono::microseconds(std::llround(us));
}

absl::StatusOr<uint64_t> ParseBytes(std::string_view key, std::string_view value) {
  if (value.front() == '-') return ValueError(key, value, "burst must be positive");
  uint64_t number = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec == std::errc::result_out_of_range) {
    return ValueError(key, value, "burst must be at most 1024m");
  }
  if (ec != std::errc()) {
    return ValueError(key, value, "not an integer number of bytes with an optional k or m suffix");
  }
  const std::string suffix =
      absl::AsciiStrToLower(AsAbsl(value.substr(static_cast<size_t>(end - value.data()))));
  uint64_t scale = 1;
  if (suffix == "k") {
    scale = 1024;
  } else if (suffix == "m") {
    scale = 1024 * 1024;
  } else if (!suffix.empty()) {
    return ValueError(key, value, absl::StrCat("unknown suffix '", suffix, "' (k or m)"));
  }
  if (number == 0) return ValueError(key, value, "burst must be positive");
  if (number > kMaxBurstBytes / scale) return ValueError(key, value, "burst must be at most 1024m");
  return number * scale;
}

// Shortest text that reads back as the same double.
std::string FormatNumber(double v) {
  std::array<char, 64> buf;
  const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), result.ptr);
}

std::string FormatRate(double mbps) {
  if (mbps >= 1e3 && (mbps / 1e3) * 1e3 == mbps) return FormatNumber(mbps / 1e3) + "gbps";
  if (mbps < 1 && (mbps * 1e3) / 1e3 == mbps) return FormatNumber(mbps * 1e3) + "kbps";
  return FormatNumber(mbps) + "mbps";
}

std::string FormatLatency(std::chrono::microseconds latency) {
  const int64_t us = latency.count();
  if (us != 0 && us % 1'000'000 == 0) return absl::StrCat(us / 1'000'000, "s");
  if (us != 0 && us % 1'000 == 0) return absl::StrCat(us / 1'000, "ms");
  return absl::StrCat(us, "us");
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes != 0 && bytes % (1024 * 1024) == 0) return absl::StrCat(bytes / (1024 * 1024), "m");
  if (bytes != 0 && bytes % 1024 == 0) return absl::StrCat(bytes / 1024, "k");
  return absl::StrCat(bytes);
}

}  // namespace

absl::StatusOr<LinkShaping> ParseLinkShaping(std::string_view spec) {
  const std::string_view body = Trim(spec);
  if (body.empty() || body == "off") return LinkShaping{};

  std::optional<double> rate, up, down;
  std::optional<std::chrono::microseconds> latency;
  std::optional<uint64_t> burst;
  size_t start = 0;
  while (true) {
    const size_t comma = body.find(',', start);
    const std::string_view item =
        Trim(body.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (item.empty()) return ShapingError(spec, "empty item (two ',' in a row, or one at an end)");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return ShapingError(spec, absl::StrCat("'", AsAbsl(item), "' is not key=value"));
    }
    const std::string_view key = Trim(item.substr(0, eq));
    const std::string_view value = Trim(item.substr(eq + 1));
    const bool known =
        key == "rate" || key == "up" || key == "down" || key == "latency" || key == "burst";
    if (!known) {
      return ShapingError(
          spec, absl::StrCat("unknown key '", AsAbsl(key), "' (rate, up, down, latency or burst)"));
    }
    const bool seen = (key == "rate" && rate) || (key == "up" && up) || (key == "down" && down) ||
                      (key == "latency" && latency) || (key == "burst" && burst);
    if (seen) return ShapingError(spec, absl::StrCat("duplicate key '", AsAbsl(key), "'"));
    if (value.empty()) return ShapingError(spec, absl::StrCat(AsAbsl(key), " has no value"));

    absl::Status status;
    if (key == "latency") {
      auto parsed = ParseLatency(key, value);
      if (parsed.ok()) latency = *parsed;
      status = parsed.status();
    } else if (key == "burst") {
      auto parsed = ParseBytes(key, value);
      if (parsed.ok()) burst = *parsed;
      status = parsed.status();
    } else {
      auto parsed = ParseRateMbps(key, value);
      if (parsed.ok()) (key == "rate" ? rate : key == "up" ? up : down) = *parsed;
      status = parsed.status();
    }
    if (!status.ok()) {
      return ShapingError(spec, std::string_view(status.message().data(), status.message().size()));
    }

    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }

  LinkShaping shaping;
  shaping.up.mbps = up.value_or(rate.value_or(0));
  shaping.down.mbps = down.value_or(rate.value_or(0));
  shaping.up.latency = shaping.down.latency = latency.value_or(std::chrono::microseconds(0));
  shaping.up.burst_bytes = shaping.down.burst_bytes = burst.value_or(kDefaultBurstBytes);
  // A depth without a rate would be silently ignored; say so instead.
  if (burst && shaping.up.mbps == 0 && shaping.down.mbps == 0) {
    return ShapingError(spec, "burst needs a rate (rate, up or down)");
  }
  return shaping;
}

std::string DescribeLinkShaping(const LinkShaping& shaping) {
  if (!shaping.enabled()) return "off";
  const ShapingOptions& up = shaping.up;
  const ShapingOptions& down = shaping.down;
  std::vector<std::string> parts;
  if (up.mbps > 0) parts.push_back("up=" + FormatRate(up.mbps));
  if (down.mbps > 0) parts.push_back("down=" + FormatRate(down.mbps));
  if (up.latency == down.latency) {
    if (up.latency.count() > 0) parts.push_back("latency=" + FormatLatency(up.latency));
  } else {
    parts.push_back("up_latency=" + FormatLatency(up.latency));
    parts.push_back("down_latency=" + FormatLatency(down.latency));
  }
  // Only a limited direction's depth means anything.
  const bool up_limited = up.mbps > 0;
  const bool down_limited = down.mbps > 0;
  if (up_limited && down_limited && up.burst_bytes != down.burst_bytes) {
    parts.push_back("up_burst=" + FormatBytes(up.burst_bytes));
    parts.push_back("down_burst=" + FormatBytes(down.burst_bytes));
  } else if (up_limited || down_limited) {
    const uint64_t burst = up_limited ? up.burst_bytes : down.burst_bytes;
    if (burst != kDefaultBurstBytes) parts.push_back("burst=" + FormatBytes(burst));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace ps::net
