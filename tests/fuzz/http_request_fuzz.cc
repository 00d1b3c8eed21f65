// Fuzz target for the metrics endpoint's request parser (server/http_endpoint.h): the
// input is what a client sends on one connection, exactly as the socket delivers it.
//
// FindHttpHeadEnd must give the same end whether it scans the input at once or as the
// server does, chunk by chunk from the previous length minus 2. ParseHttpRequestHead,
// run on the whole input and on the head FindHttpHeadEnd delimits, must not crash and
// must refuse with INVALID_ARGUMENT and a message. When it accepts: the input is exactly
// one head, the method and field names are tokens, the path starts with '/' and holds
// only visible ASCII without '?' or '#', no value holds CR, LF or NUL or starts or ends
// with a blank, an HTTP/1.1 request has one Host field, and the head written back in
// canonical form (origin-form target, "Name: value" fields) parses to the same fields.
// Seeds: tests/fuzz/corpus/http_request/ (docs/fuzzing.md).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/http_endpoint.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using ps::net::FindHttpHeadEnd;
using ps::net::HttpRequestHead;
using ps::net::ParseHttpRequestHead;

constexpr size_t kNpos = std::string_view::npos;

bool IsTchar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != kNpos;
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTchar(c)) return false;
  }
  return true;
}

bool IsVisibleAscii(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string Canonical(const HttpRequestHead& h) {
  std::string out = h.method + " " + h.path + (h.query.empty() ? "" : "?" + h.query) + " HTTP/" +
                    std::to_string(h.version_major) + "." + std::to_string(h.version_minor) +
                    "\r\n";
  for (const auto& [name, value] : h.headers) out += name + ": " + value + "\r\n";
  return out + "\r\n";
}

bool SameHead(const HttpRequestHead& a, const HttpRequestHead& b) {
  return a.method == b.method && a.path == b.path && a.query == b.query &&
         a.version_major == b.version_major && a.version_minor == b.version_minor &&
         a.headers == b.headers;
}

// Parses `bytes`; checks the refusal or the accepted head.
void Check(std::string_view bytes) {
  const auto parsed = ParseHttpRequestHead(bytes);
  if (!parsed.ok()) {
    PS_FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument,
                  "ParseHttpRequestHead failed with a code other than INVALID_ARGUMENT");
    PS_FUZZ_CHECK(!parsed.status().message().empty(), "refused without a message");
    return;
  }
  const HttpRequestHead& h = *parsed;
  PS_FUZZ_CHECK(FindHttpHeadEnd(bytes) == bytes.size(),
                "accepted bytes that are not exactly one head");
  PS_FUZZ_CHECK(IsToken(h.method), "accepted a method that is not a token");
  PS_FUZZ_CHECK(!h.path.empty() && h.path[0] == '/', "accepted a path not starting with '/'");
  PS_FUZZ_CHECK(IsVisibleAscii(h.path) && h.path.find_first_of("?#") == std::string::npos,
                "the path holds a blank, control, non-ASCII, '?' or '#' character");
  PS_FUZZ_CHECK(h.query.empty() || (IsVisibleAscii(h.query) && h.query.find('#') == kNpos),
                "the query holds a blank, control, non-ASCII or '#' character");
  PS_FUZZ_CHECK(h.version_major >= 0 && h.version_major <= 9 && h.version_minor >= 0 &&
                    h.version_minor <= 9,
                "a version digit out of range");
  size_t hosts = 0;
  for (const auto& [name, value] : h.headers) {
    PS_FUZZ_CHECK(IsToken(name), "accepted a field name that is not a token");
    PS_FUZZ_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
                  "a field value holds CR, LF or NUL");
    PS_FUZZ_CHECK(value.empty() || (value.front() != ' ' && value.front() != '\t' &&
                                    value.back() != ' ' && value.back() != '\t'),
                  "a field value keeps surrounding blanks");
    if (EqualsIgnoreCase(name, "host")) ++hosts;
    PS_FUZZ_CHECK(h.FindHeader(name) != nullptr, "FindHeader misses a field the head has");
  }
  if (h.version_major == 1 && h.version_minor >= 1) {
    PS_FUZZ_CHECK(hosts == 1, "accepted an HTTP/1.1 request without exactly one Host");
  }
  const std::string canonical = Canonical(h);
  const auto again = ParseHttpRequestHead(canonical);
  PS_FUZZ_CHECK(again.ok(), "the canonical form of an accepted head does not parse");
  PS_FUZZ_CHECK(SameHead(h, *again), "the canonical form parses to other fields");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t end = FindHttpHeadEnd(input);
  PS_FUZZ_CHECK(end == kNpos || (end >= 2 && end <= size), "a head end outside the input");
  if (end != kNpos) {
    PS_FUZZ_CHECK(input[end - 1] == '\n', "a head end not just past a LF");
    PS_FUZZ_CHECK(FindHttpHeadEnd(input.substr(0, end - 1)) == kNpos,
                  "a complete head before the end found");
  }

  // The server's incremental scan: chunks of 1 to 16 bytes, sizes taken from the input.
  size_t received = 0;
  size_t found = kNpos;
  for (size_t i = 0; received < size && found == kNpos; ++i) {
    const size_t before = received;
    received = std::min(size, received + 1 + static_cast<uint8_t>(input[i % size]) % 16);
    found = FindHttpHeadEnd(input.substr(0, received), before >= 2 ? before - 2 : 0);
  }
  PS_FUZZ_CHECK(found == end, "the incremental scan finds another head end");

  Check(input);
  if (end != kNpos && end != size) Check(input.substr(0, end));
  return 0;
}
