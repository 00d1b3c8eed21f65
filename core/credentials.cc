#include "core/credentials.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/status.h"

namespace ps::core {

std::string Identity::Name() const {
  switch (kind) {
    case Kind::kWorker: return absl::StrCat("worker-", index);
    case Kind::kShard: return absl::StrCat("shard-", index);
    case Kind::kAdmin: return "admin";
  }
  return "?";
}

absl::StatusOr<Identity> ParseIdentity(std::string_view name) {
  if (name == "admin") return Identity{Identity::Kind::kAdmin, 0};
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "identity \"", ClientText(name), "\" is not worker-N, shard-N or admin"));
  };
  Identity id;
  std::string_view digits;
  if (name.starts_with("worker-")) {
    id.kind = Identity::Kind::kWorker;
    digits = name.substr(7);
  } else if (name.starts_with("shard-")) {
    id.kind = Identity::Kind::kShard;
    digits = name.substr(6);
  } else {
    return bad();
  }
  if (digits.empty() || digits.size() > 10 || (digits.size() > 1 && digits[0] == '0')) return bad();
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || value >= (1ull << 31)) {
    return bad();
  }
  id.index = static_cast<uint32_t>(value);
  return id;
}

absl::Status CheckToken(std::string_view token) {
  if (token.size() < 16 || token.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("a token must have 16 to 4096 characters, this one has ", token.size()));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "a token must be printable ASCII without spaces (e.g. openssl rand -hex 32)");
    }
  }
  return absl::OkStatus();
}

absl::Status ClientCredentials::Validate() const {
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("a client certificate needs its key and the other way round");
  }
  if (!tls_cert.empty() && !tls()) {
    return absl::InvalidArgumentError(
        "a client certificate needs TLS: give the CA that signed the shards' certificates too");
  }
  if (!token.empty()) PS_RETURN_IF_ERROR(CheckToken(token));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", AsAbsl(what), " ", path));
  }
  std::ostringstream out;
  out << in.rdbuf();
  std::string data = std::move(out).str();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", AsAbsl(what), " ", path));
  if (data.size() > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(what), " ", path, " is larger than 1 MiB"));
  }
  return data;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::string data, ReadSmallFile(path, "token file"));
  std::string token(absl::StripAsciiWhitespace(data));
  if (absl::Status st = CheckToken(token); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": ", st.message()));
  }
  return token;
}

}  // namespace ps::core
