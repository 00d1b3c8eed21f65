// The connection frames of the handshake (net/data_frame.h): HELLO, CHALLENGE, PROOF and
// ADMIT, each its encoder and its parser. HELLO's parser refuses another magic and names
// another version; the rest are fixed sizes.
#include "net/data_frame.h"

#include <array>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/data_frame_internal.h"

namespace ps::net {
namespace {

using internal::AppendFrame;
using internal::MetaReader;
using internal::MetaWriter;

constexpr char kHelloMagic[4] = {'P', 'S', 'D', '1'};

}  // namespace

absl::Status AppendHello(const HelloMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kHello, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Bytes(std::string_view(kHelloMagic, sizeof(kHelloMagic)));
    w.Int(kDataPlaneVersion, 4);
    w.Int(meta.data_session, 8);
    w.Int(meta.worker_id, 4);
    w.Bytes(std::string_view(meta.client_nonce.data(), meta.client_nonce.size()));
  });
}

absl::StatusOr<HelloMeta> ParseHelloMeta(std::string_view meta) {
  MetaReader r(FrameType::kHello, meta);
  std::array<char, sizeof(kHelloMagic)> magic{};
  PS_RETURN_IF_ERROR(r.Fixed(&magic, "magic"));
  if (std::memcmp(magic.data(), kHelloMagic, sizeof(kHelloMagic)) != 0) {
    return r.Error("bad magic (not PSD1)");
  }
  uint32_t version = 0;
  PS_RETURN_IF_ERROR(r.Int(&version, "version"));
  if (version != kDataPlaneVersion) {
    return r.Error(absl::StrCat("version ", version, "; this shard speaks version ",
                                kDataPlaneVersion));
  }
  HelloMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.data_session, "data session"));
  PS_RETURN_IF_ERROR(r.Int(&m.worker_id, "worker id"));
  PS_RETURN_IF_ERROR(r.Fixed(&m.client_nonce, "client nonce"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendChallenge(const ChallengeMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kChallenge, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Int(meta.shard_index, 4);
    w.Bytes(std::string_view(meta.server_nonce.data(), meta.server_nonce.size()));
    w.Bytes(std::string_view(meta.proof.data(), meta.proof.size()));
  });
}

absl::StatusOr<ChallengeMeta> ParseChallengeMeta(std::string_view meta) {
  MetaReader r(FrameType::kChallenge, meta);
  ChallengeMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.shard_index, "shard index"));
  PS_RETURN_IF_ERROR(r.Fixed(&m.server_nonce, "server nonce"));
  PS_RETURN_IF_ERROR(r.Fixed(&m.proof, "proof"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendProof(const ProofMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kProof, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Bytes(std::string_view(meta.proof.data(), meta.proof.size()));
  });
}

absl::StatusOr<ProofMeta> ParseProofMeta(std::string_view meta) {
  MetaReader r(FrameType::kProof, meta);
  ProofMeta m;
  PS_RETURN_IF_ERROR(r.Fixed(&m.proof, "proof"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendAdmit(const AdmitMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kAdmit, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Int(meta.max_body_bytes, 4);
    w.Int(meta.max_unanswered_pushes, 4);
    w.Int(meta.max_pull_slices, 4);
    w.Int(meta.idle_timeout_ms, 4);
  });
}

absl::StatusOr<AdmitMeta> ParseAdmitMeta(std::string_view meta) {
  MetaReader r(FrameType::kAdmit, meta);
  AdmitMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.max_body_bytes, "largest body"));
  PS_RETURN_IF_ERROR(r.Int(&m.max_unanswered_pushes, "unanswered pushes"));
  PS_RETURN_IF_ERROR(r.Int(&m.max_pull_slices, "slices per pull"));
  PS_RETURN_IF_ERROR(r.Int(&m.idle_timeout_ms, "idle timeout"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

}  // namespace ps::net
