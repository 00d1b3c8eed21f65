// The frames of pushes and pulls (net/data_frame.h), each its encoder and its parser:
// PUSH, PUSHES and their ANSWER, PULL with its body, SLICE, SLICES, PULL_END and CANCEL, and GOAWAY, which
// carries a status as ANSWER and PULL_END do. The header and the receiver's checks are in
// data_frame_header.cc, the handshake's frames in data_frame_handshake.cc.
#include "net/data_frame.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/status.h"
#include "net/data_frame_internal.h"
#include "net/little_endian_internal.h"

namespace ps::net {
namespace {

using internal::AppendFrame;
using internal::FrameError;
using internal::Hex8;
using internal::kPullHeld;
using internal::kPushLoss;
using internal::kPushLr;
using internal::kSliceFirstLoss;
using internal::kSliceLoss;
using internal::kSliceQueued;
using internal::LoadLe;
using internal::MetaReader;
using internal::MetaWriter;
using internal::PullBodyBytes;

// Field checks of the encoders. The parsers check the same lengths as they read them
// (MetaReader::Str) and a status's code and text with CheckStatusMeta after.

absl::Status CheckCodec(FrameType type, std::string_view codec) {
  if (codec.size() <= kMaxFrameCodecBytes) return absl::OkStatus();
  return FrameError(type, absl::StrCat("codec of ", codec.size(), " bytes is over the limit of ",
                                       kMaxFrameCodecBytes));
}

absl::Status CheckStatusMeta(FrameType type, const StatusMeta& meta) {
  const int code = static_cast<int>(meta.code);
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return FrameError(type, absl::StrCat("status code ", code, " is not a canonical code (0-16)"));
  }
  if (meta.refusal_name.size() > kMaxRefusalNameBytes) {
    return FrameError(type, absl::StrCat("refusal name of ", meta.refusal_name.size(),
                                         " bytes is over the limit of ", kMaxRefusalNameBytes));
  }
  // The names of core::RefusalName, the `reason` label of ps_refusals_total: snake case.
  for (size_t i = 0; i < meta.refusal_name.size(); ++i) {
    const char c = meta.refusal_name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      return FrameError(type, absl::StrCat("refusal name byte ", i, " (",
                                           Hex8(static_cast<uint8_t>(c)),
                                           ") is not in [a-z0-9_]"));
    }
  }
  if (meta.message.size() > kMaxStatusMessageBytes) {
    return FrameError(type, absl::StrCat("message of ", meta.message.size(),
                                         " bytes is over the limit of ", kMaxStatusMessageBytes));
  }
  // Shown to users as it is: it must be text.
  if (!core::IsUtf8(meta.message)) return FrameError(type, "message is not valid UTF-8");
  return absl::OkStatus();
}

absl::Status AppendStatus(FrameType type, uint64_t tag, const StatusMeta& meta,
                          std::string* out) {
  PS_RETURN_IF_ERROR(CheckStatusMeta(type, meta));
  return AppendFrame(type, 0, tag, 0, out, [&](MetaWriter& w) {
    w.Int(static_cast<uint8_t>(meta.code), 1);
    w.Str(meta.refusal_name, 1);
    w.Str(meta.message, 2);
  });
}

}  // namespace

absl::Status CheckPayload(FrameType type, std::string_view codec, uint64_t body_bytes) {
  PS_RETURN_IF_ERROR(CheckCodec(type, codec));
  if (body_bytes > std::numeric_limits<uint32_t>::max()) {
    return FrameError(type, absl::StrCat("body of ", body_bytes,
                                         " bytes does not fit the 4-byte body length"));
  }
  return absl::OkStatus();
}

absl::Status AppendPush(uint64_t tag, const PushMeta& meta, size_t body_bytes, std::string* out) {
  PS_RETURN_IF_ERROR(CheckPayload(FrameType::kPush, meta.codec, body_bytes));
  const uint8_t flags = static_cast<uint8_t>((meta.loss.has_value() ? kPushLoss : 0) |
                                             (meta.lr.has_value() ? kPushLr : 0));
  return AppendFrame(FrameType::kPush, flags, tag, body_bytes, out, [&](MetaWriter& w) {
    w.Int(meta.layout_hash, 8);
    w.Int(meta.round, 8);
    w.Int(meta.slice_id, 4);
    if (meta.loss.has_value()) w.F32(*meta.loss);
    if (meta.lr.has_value()) w.F32(*meta.lr);
    w.Str(meta.codec, 1);
  });
}

absl::StatusOr<PushMeta> ParsePushMeta(uint8_t flags, std::string_view meta) {
  MetaReader r(FrameType::kPush, meta);
  PushMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.layout_hash, "layout hash"));
  PS_RETURN_IF_ERROR(r.Int(&m.round, "round"));
  PS_RETURN_IF_ERROR(r.Int(&m.slice_id, "slice id"));
  if ((flags & kPushLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&m.loss, "loss"));
  if ((flags & kPushLr) != 0) PS_RETURN_IF_ERROR(r.F32(&m.lr, "learning rate"));
  PS_RETURN_IF_ERROR(r.Str(1, kMaxFrameCodecBytes, &m.codec, "codec"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendPushes(const PushesMeta& meta, std::string* out) {
  PS_RETURN_IF_ERROR(CheckCodec(FrameType::kPushes, meta.codec));
  if (meta.count < 2 || meta.count > kMaxPushesPerFrame) {
    return FrameError(FrameType::kPushes, absl::StrCat("count ", meta.count, " is outside [2, ",
                                                       kMaxPushesPerFrame, "]"));
  }
  const PushesEntry& first = meta.entries[0];
  uint64_t body_bytes = 0;
  for (uint32_t i = 0; i < meta.count; ++i) {
    const PushesEntry& e = meta.entries[i];
    if (e.tag == 0) return FrameError(FrameType::kPushes, absl::StrCat("push ", i, " has tag 0"));
    if (e.loss.has_value() != first.loss.has_value() || e.lr.has_value() != first.lr.has_value()) {
      return FrameError(FrameType::kPushes,
                        absl::StrCat("push ", i, " differs from the first in carrying a loss or a "
                                                 "learning rate"));
    }
    body_bytes += e.body_bytes;
  }
  const uint8_t flags = static_cast<uint8_t>((first.loss.has_value() ? kPushLoss : 0) |
                                             (first.lr.has_value() ? kPushLr : 0));
  return AppendFrame(FrameType::kPushes, flags, first.tag, body_bytes, out, [&](MetaWriter& w) {
    w.Int(meta.layout_hash, 8);
    w.Int(meta.round, 8);
    w.Str(meta.codec, 1);
    w.Int(meta.count, 1);
    for (uint32_t i = 0; i < meta.count; ++i) {
      const PushesEntry& e = meta.entries[i];
      w.Int(e.tag, 8);
      w.Int(e.slice_id, 4);
      w.Int(e.body_bytes, 4);
      if (e.loss.has_value()) w.F32(*e.loss);
      if (e.lr.has_value()) w.F32(*e.lr);
    }
  });
}

absl::StatusOr<PushesMeta> ParsePushesMeta(const FrameHeader& header, std::string_view meta) {
  MetaReader r(FrameType::kPushes, meta);
  PushesMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.layout_hash, "layout hash"));
  PS_RETURN_IF_ERROR(r.Int(&m.round, "round"));
  PS_RETURN_IF_ERROR(r.Str(1, kMaxFrameCodecBytes, &m.codec, "codec"));
  uint8_t count = 0;
  PS_RETURN_IF_ERROR(r.Int(&count, "count"));
  if (count < 2 || count > kMaxPushesPerFrame) {
    return r.Error(absl::StrCat("count ", count, " is outside [2, ", kMaxPushesPerFrame, "]"));
  }
  m.count = count;
  uint64_t body_bytes = 0;
  for (uint32_t i = 0; i < m.count; ++i) {
    PushesEntry& e = m.entries[i];
    PS_RETURN_IF_ERROR(r.Int(&e.tag, "tag"));
    PS_RETURN_IF_ERROR(r.Int(&e.slice_id, "slice id"));
    PS_RETURN_IF_ERROR(r.Int(&e.body_bytes, "body length"));
    if ((header.flags & kPushLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&e.loss, "loss"));
    if ((header.flags & kPushLr) != 0) PS_RETURN_IF_ERROR(r.F32(&e.lr, "learning rate"));
    if (e.tag == 0) return r.Error(absl::StrCat("push ", i, " has tag 0"));
    body_bytes += e.body_bytes;
  }
  PS_RETURN_IF_ERROR(r.Finish());
  if (m.entries[0].tag != header.tag) {
    return r.Error(absl::StrCat("the first push's tag ", m.entries[0].tag,
                                " is not the header's ", header.tag));
  }
  if (body_bytes != header.body_bytes) {
    return r.Error(absl::StrCat("body lengths add up to ", body_bytes, " bytes, the header says ",
                                header.body_bytes));
  }
  return m;
}

absl::Status AppendAnswer(uint64_t tag, const StatusMeta& meta, std::string* out) {
  return AppendStatus(FrameType::kAnswer, tag, meta, out);
}

absl::Status AppendPullEnd(uint64_t tag, const StatusMeta& meta, std::string* out) {
  return AppendStatus(FrameType::kPullEnd, tag, meta, out);
}

absl::Status AppendGoaway(const StatusMeta& meta, std::string* out) {
  return AppendStatus(FrameType::kGoaway, 0, meta, out);
}

absl::StatusOr<StatusMeta> ParseStatusMeta(FrameType type, std::string_view meta) {
  MetaReader r(type, meta);
  StatusMeta m;
  uint8_t code = 0;
  PS_RETURN_IF_ERROR(r.Int(&code, "status code"));
  m.code = static_cast<absl::StatusCode>(code);
  PS_RETURN_IF_ERROR(r.Str(1, kMaxRefusalNameBytes, &m.refusal_name, "refusal name"));
  PS_RETURN_IF_ERROR(r.Str(2, kMaxStatusMessageBytes, &m.message, "message"));
  PS_RETURN_IF_ERROR(r.Finish());
  PS_RETURN_IF_ERROR(CheckStatusMeta(type, m));
  return m;
}

absl::Status AppendPull(uint64_t tag, const PullMeta& meta, std::span<const uint32_t> slice_ids,
                        std::span<const uint64_t> held_versions, std::string* out) {
  if (meta.count != slice_ids.size()) {
    return FrameError(FrameType::kPull, absl::StrCat("count ", meta.count, " for ",
                                                     slice_ids.size(), " slice ids"));
  }
  if (held_versions.size() != (meta.held ? slice_ids.size() : 0)) {
    return FrameError(FrameType::kPull,
                      absl::StrCat(held_versions.size(), " held versions for ", slice_ids.size(),
                                   " slice ids with the held flag ", meta.held ? "set" : "clear"));
  }
  if (meta.held && meta.count == 0) {
    return FrameError(FrameType::kPull, "held flag on a pull of no slices");
  }
  const uint8_t flags = meta.held ? kPullHeld : 0;
  PS_RETURN_IF_ERROR(AppendFrame(FrameType::kPull, flags, tag,
                                 PullBodyBytes(slice_ids.size(), meta.held), out,
                                 [&](MetaWriter& w) {
                                   w.Int(meta.layout_hash, 8);
                                   w.Int(meta.min_version, 8);
                                   w.Int(meta.held_epoch, 8);
                                   w.Int(meta.count, 4);
                                 }));
  out->reserve(out->size() + PullBodyBytes(slice_ids.size(), meta.held));
  MetaWriter w(out);
  for (uint32_t id : slice_ids) w.Int(id, 4);
  for (uint64_t v : held_versions) w.Int(v, 8);
  return absl::OkStatus();
}

absl::StatusOr<PullMeta> ParsePullMeta(uint8_t flags, std::string_view meta) {
  MetaReader r(FrameType::kPull, meta);
  PullMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.layout_hash, "layout hash"));
  PS_RETURN_IF_ERROR(r.Int(&m.min_version, "min version"));
  PS_RETURN_IF_ERROR(r.Int(&m.held_epoch, "held epoch"));
  PS_RETURN_IF_ERROR(r.Int(&m.count, "count"));
  PS_RETURN_IF_ERROR(r.Finish());
  m.held = (flags & kPullHeld) != 0;
  if (m.held && m.count == 0) return r.Error("held flag on a pull of no slices");
  return m;
}

absl::Status CheckPullBody(const FrameHeader& header, const PullMeta& meta,
                           const FrameLimits& limits) {
  if (meta.count > limits.max_pull_slices) {
    return FrameError(FrameType::kPull,
                      absl::StrCat("count ", meta.count, " is over the ", limits.max_pull_slices,
                                   " slices a pull may name"));
  }
  const uint64_t need = PullBodyBytes(meta.count, meta.held);
  if (header.body_bytes != need) {
    return FrameError(FrameType::kPull,
                      absl::StrCat("body length ", header.body_bytes, ", where ", meta.count,
                                   " slice ids", meta.held ? " and held versions" : "", " need ",
                                   need, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PullBody> ParsePullBody(const PullMeta& meta, std::string_view body) {
  const uint64_t need = PullBodyBytes(meta.count, meta.held);
  if (body.size() != need) {
    return FrameError(FrameType::kPull,
                      absl::StrCat("body of ", body.size(), " bytes, where ", meta.count,
                                   " slice ids", meta.held ? " and held versions" : "", " need ",
                                   need, " bytes"));
  }
  // Sized by the body's length, checked above: no allocation beyond the input's size.
  PullBody out;
  out.slice_ids.resize(meta.count);
  for (size_t i = 0; i < meta.count; ++i) {
    out.slice_ids[i] = static_cast<uint32_t>(LoadLe(body.data() + 4 * i, 4));
  }
  if (meta.held) {
    const char* held = body.data() + 4 * size_t{meta.count};
    out.held_versions.resize(meta.count);
    for (size_t i = 0; i < meta.count; ++i) out.held_versions[i] = LoadLe(held + 8 * i, 8);
  }
  return out;
}

namespace {
// A SLICE's header flags, and a SLICES entry's flag byte.
uint8_t SliceFlags(const SliceFields& f) {
  return (f.loss.has_value() ? kSliceLoss : 0) | (f.first_loss.has_value() ? kSliceFirstLoss : 0) |
         (f.queued ? kSliceQueued : 0);
}
}  // namespace

absl::Status AppendSlice(uint64_t tag, const PullHeader& meta, size_t body_bytes,
                         std::string* out) {
  PS_RETURN_IF_ERROR(CheckPayload(FrameType::kSlice, meta.codec, body_bytes));
  return AppendFrame(FrameType::kSlice, SliceFlags(meta), tag, body_bytes, out, [&](MetaWriter& w) {
    w.Int(meta.slice_id, 4);
    w.Int(meta.version, 8);
    w.Int(meta.base_version, 8);
    w.Int(meta.epoch, 8);
    if (meta.loss.has_value()) w.F32(*meta.loss);
    if (meta.first_loss.has_value()) w.F32(*meta.first_loss);
    w.Str(meta.codec, 1);
  });
}

absl::StatusOr<PullHeader> ParseSliceMeta(uint8_t flags, std::string_view meta) {
  MetaReader r(FrameType::kSlice, meta);
  PullHeader m;
  PS_RETURN_IF_ERROR(r.Int(&m.slice_id, "slice id"));
  PS_RETURN_IF_ERROR(r.Int(&m.version, "version"));
  PS_RETURN_IF_ERROR(r.Int(&m.base_version, "base version"));
  PS_RETURN_IF_ERROR(r.Int(&m.epoch, "epoch"));
  if ((flags & kSliceLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&m.loss, "loss"));
  if ((flags & kSliceFirstLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&m.first_loss, "first loss"));
  PS_RETURN_IF_ERROR(r.Str(1, kMaxFrameCodecBytes, &m.codec, "codec"));
  PS_RETURN_IF_ERROR(r.Finish());
  m.queued = (flags & kSliceQueued) != 0;
  return m;
}

absl::Status AppendSlices(uint64_t tag, const SlicesMeta& meta, std::string* out) {
  PS_RETURN_IF_ERROR(CheckCodec(FrameType::kSlices, meta.codec));
  if (meta.count < 2 || meta.count > kMaxSlicesPerFrame) {
    return FrameError(FrameType::kSlices, absl::StrCat("count ", meta.count, " is outside [2, ",
                                                       kMaxSlicesPerFrame, "]"));
  }
  uint64_t body_bytes = 0;
  for (uint32_t i = 0; i < meta.count; ++i) body_bytes += meta.entries[i].body_bytes;
  return AppendFrame(FrameType::kSlices, 0, tag, body_bytes, out, [&](MetaWriter& w) {
    w.Str(meta.codec, 1);
    w.Int(meta.count, 1);
    for (uint32_t i = 0; i < meta.count; ++i) {
      const SlicesEntry& e = meta.entries[i];
      w.Int(e.slice_id, 4);
      w.Int(e.version, 8);
      w.Int(e.base_version, 8);
      w.Int(e.epoch, 8);
      w.Int(SliceFlags(e), 1);
      if (e.loss.has_value()) w.F32(*e.loss);
      if (e.first_loss.has_value()) w.F32(*e.first_loss);
      w.Int(e.body_bytes, 4);
    }
  });
}

absl::StatusOr<SlicesMeta> ParseSlicesMeta(const FrameHeader& header, std::string_view meta) {
  MetaReader r(FrameType::kSlices, meta);
  SlicesMeta m;
  PS_RETURN_IF_ERROR(r.Str(1, kMaxFrameCodecBytes, &m.codec, "codec"));
  uint8_t count = 0;
  PS_RETURN_IF_ERROR(r.Int(&count, "count"));
  if (count < 2 || count > kMaxSlicesPerFrame) {
    return r.Error(absl::StrCat("count ", count, " is outside [2, ", kMaxSlicesPerFrame, "]"));
  }
  m.count = count;
  constexpr uint8_t kKnown = kSliceLoss | kSliceFirstLoss | kSliceQueued;
  uint64_t body_bytes = 0;
  for (uint32_t i = 0; i < m.count; ++i) {
    SlicesEntry& e = m.entries[i];
    PS_RETURN_IF_ERROR(r.Int(&e.slice_id, "slice id"));
    PS_RETURN_IF_ERROR(r.Int(&e.version, "version"));
    PS_RETURN_IF_ERROR(r.Int(&e.base_version, "base version"));
    PS_RETURN_IF_ERROR(r.Int(&e.epoch, "epoch"));
    uint8_t flags = 0;
    PS_RETURN_IF_ERROR(r.Int(&flags, "slice flags"));
    if ((flags & ~kKnown) != 0) {
      return r.Error(absl::StrCat("slice ", i, "'s flags ", Hex8(flags),
                                  " set bits a slice does not define (it has ", Hex8(kKnown), ")"));
    }
    if ((flags & kSliceLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&e.loss, "loss"));
    if ((flags & kSliceFirstLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&e.first_loss, "first loss"));
    e.queued = (flags & kSliceQueued) != 0;
    PS_RETURN_IF_ERROR(r.Int(&e.body_bytes, "body length"));
    body_bytes += e.body_bytes;
  }
  PS_RETURN_IF_ERROR(r.Finish());
  if (body_bytes != header.body_bytes) {
    return r.Error(absl::StrCat("body lengths add up to ", body_bytes, " bytes, the header says ",
                                header.body_bytes));
  }
  return m;
}

absl::Status AppendCancel(uint64_t tag, std::string* out) {
  return AppendFrame(FrameType::kCancel, 0, tag, 0, out, [](MetaWriter&) {});
}

}  // namespace ps::net
