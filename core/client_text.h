// Client text in messages and logs. Whatever a request carries (tensor names, codec
// specs, configuration summaries, certificate names) may be huge or hold control bytes;
// a status message or a log line quotes at most a bounded, printable prefix of it, so
// no client can flood a log or forge log lines through its own text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ps::core {

// At most `max_bytes` bytes of `text`, bytes outside printable ASCII as '?', and, when
// cut, "... (N bytes)" saying how long the text was.
std::string ClientText(std::string_view text, size_t max_bytes = 64);

// Whether `text` is well-formed UTF-8 (RFC 3629): no stray continuation byte, truncated
// or overlong sequence, surrogate, or code point above U+10FFFF. For text that crosses
// the wire to be shown as it is (a data-plane refusal's message, net/data_frame.h),
// where replacing bytes as ClientText does would change what the sender said.
bool IsUtf8(std::string_view text);

}  // namespace ps::core
