#include "server/codec_policy.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "codecs/codec.h"
#include "core/client_text.h"
#include "core/refusal.h"
#include "core/spec.h"
#include "core/status.h"
#include "server/decoder_cache.h"

namespace ps::server {

absl::StatusOr<CodecPolicy> CodecPolicy::Parse(std::string_view list) {
  CodecPolicy policy;
  if (list.empty()) return policy;
  const std::vector<std::string> known = codecs::StageNames();
  for (absl::string_view part : absl::StrSplit(core::AsAbsl(list), ',')) {
    const std::string name(absl::StripAsciiWhitespace(part));
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", name, "' is not a codec stage; known: ", absl::StrJoin(known, ", ")));
    }
    if (!policy.allowed_.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' is listed twice"));
    }
  }
  return policy;
}

absl::Status CodecPolicy::Check(std::string_view who, std::string_view spec) const {
  if (allowed_.empty() || spec.size() > DecoderCache::kMaxSpecBytes) return absl::OkStatus();
  absl::StatusOr<std::vector<core::StageSpec>> stages = core::ParseSpec(spec, "codec spec");
  if (!stages.ok()) return absl::OkStatus();
  for (const core::StageSpec& stage : *stages) {
    if (allowed_.contains(stage.name)) continue;
    return core::Refused(core::Refusal::kCodecNotAllowed,
                         absl::StrCat(core::AsAbsl(who), ": codec \"",
                                      core::ClientText(spec, DecoderCache::kMaxSpecBytes),
                                      "\" uses '", core::ClientText(stage.name),
                                      "', which this shard does not decode "
                                      "(--allowed-codecs: ",
                                      Describe(), ")"));
  }
  return absl::OkStatus();
}

std::string CodecPolicy::Describe() const {
  return allowed_.empty() ? "every codec" : absl::StrJoin(allowed_, ", ");
}

}  // namespace ps::server
