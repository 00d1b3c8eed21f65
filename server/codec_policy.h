// CodecPolicy: which codecs a shard decodes (--allowed-codecs, docs/adaptive.md
// "Shard-side policy"). Workers name a codec per push, and with adaptive communication
// they change it per push; the operator bounds the choice by stage names: a push is
// allowed when every stage of its spec ("topk", "varint", "fp16" in
// "topk(0.01)+varint+fp16") is in the list. The check reads at most the spec's bytes
// (DecoderCache::kMaxSpecBytes), before any decoder is made.
//
// Thread safety: immutable after Parse; Check may run concurrently.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::server {

class CodecPolicy {
 public:
  // Every codec allowed.
  CodecPolicy() = default;

  // `list`: stage names separated by commas ("fp32,fp16,topk,varint,raw"), each one of
  // codecs::StageNames(); empty: every codec. Refuses unknown and repeated names.
  static absl::StatusOr<CodecPolicy> Parse(std::string_view list);

  bool allows_all() const { return allowed_.empty(); }

  // OK when every stage of `spec` is allowed (and for a spec that does not parse or is
  // too long: DecoderCache refuses those as unknown_codec); otherwise a refusal of kind
  // codec_not_allowed naming the stage and the allowed ones. `who`: the start of the
  // message ("push from worker 3 for slice 7").
  absl::Status Check(std::string_view who, std::string_view spec) const;

  // "every codec", or the allowed names joined by ", ".
  std::string Describe() const;

 private:
  std::set<std::string, std::less<>> allowed_;
};

}  // namespace ps::server
