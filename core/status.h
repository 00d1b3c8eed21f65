// Status helpers shared by every module: return-if-error macros in the style of
// Arrow's ARROW_RETURN_NOT_OK / ASSIGN_OR_RAISE, over absl::Status.
#pragma once

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::core {

// Debian's abseil has its own absl::string_view, distinct from std::string_view; this
// passes a std::string_view to absl::StrCat and friends.
inline absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace ps::core

#define PS_CONCAT_INNER_(a, b) a##b
#define PS_CONCAT_(a, b) PS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define PS_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status _ps_status = (expr);          \
    if (!_ps_status.ok()) return _ps_status;     \
  } while (false)

#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

// `PS_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define PS_ASSIGN_OR_RETURN(lhs, rexpr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_CONCAT_(_ps_statusor_, __LINE__), lhs, rexpr)
