// The config-file grammar shared by ps-server's --config file (server/config_file.h) and
// ps-experiment's grid files and --set lines (examples/fashion_mnist/experiment.h): a
// subset of TOML with flat keys only.
//
//   line    = [key '=' value] ['#' comment]   blank lines and comments are skipped
//   key     = [A-Za-z0-9_-]+                   a dotted key or a [table] is refused
//   value   = scalar | '[' [scalar (',' scalar)* [',']] ']'
//   scalar  = "text" | 'text' | bare
//
// A '#' outside quotes starts a comment. Strings hold no escape sequences (a backslash
// stands for itself) and end on their line. A bare scalar is the text up to a comment
// (in an array: up to ',' or ']'), trimmed, without quotes. An array may span lines,
// with comments at their ends. ReadConfigText only splits: what a value means (a
// number, a boolean, a list) is the caller's to decide.
//
// Thread safety: a plain function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ps::core {

// One `key = value` of a config text, or a line that is not one.
struct ConfigEntry {
  size_t line = 0;  // 1-based: where the key stands (where an array starts)
  std::string key;  // as written; empty where the line has none
  // A scalar's one value, or the array's elements (none for `[]`), quotes removed.
  std::vector<std::string> values;
  bool array = false;
  // Non-empty: what is wrong with the entry ("unterminated string"), without its line
  // or key; `values` are then empty. Tables and lines without '=' come with an empty
  // key, dotted keys with theirs.
  std::string error;
};

// The entries of `text` in order, refused ones included: reading goes on at the next
// line after a refusal, so each caller decides which refusal to report first.
std::vector<ConfigEntry> ReadConfigText(std::string_view text);

}  // namespace ps::core
