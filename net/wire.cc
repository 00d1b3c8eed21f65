#include "net/wire.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps::net {

void ByteRange::CopyTo(char* dst) const {
  for (std::string_view part : parts_) {
    std::memcpy(dst, part.data(), part.size());
    dst += part.size();
  }
}

std::string ByteRange::ToString() const {
  std::string out(size_, '\0');
  CopyTo(out.data());
  return out;
}

std::string_view ByteRange::Contiguous(std::string* scratch) const {
  if (parts_.empty()) return {};
  if (parts_.size() == 1) return parts_[0];
  scratch->resize(size_);  // reuses the scratch's capacity: no allocation once it is warm
  CopyTo(scratch->data());
  return *scratch;
}

void ByteRange::Append(std::string_view part) {
  if (part.empty()) return;
  parts_.push_back(part);
  size_ += part.size();
}

namespace {

enum WireType : int { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Reads protobuf's wire format across pieces, never past their end.
class Reader {
 public:
  explicit Reader(Pieces pieces) : pieces_(pieces) {
    for (std::string_view p : pieces) remaining_ += p.size();
    SkipEmpty();
  }

  bool AtEnd() const { return remaining_ == 0; }

  // At most `max_bytes` bytes (10 for a value, 5 for a field tag, as protobuf reads them).
  bool Varint(uint64_t* value, int max_bytes = 10) {
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      if (AtEnd()) return false;
      const auto b = static_cast<uint8_t>(pieces_[piece_][offset_]);
      Advance(1);
      v |= uint64_t{b & 0x7fu} << (7 * i);
      if ((b & 0x80u) == 0) {
        *value = v;
        return true;
      }
    }
    return false;  // longer than max_bytes
  }

  bool Fixed(size_t bytes, uint64_t* value) {
    if (remaining_ < bytes) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; ++i) {
      v |= uint64_t{static_cast<uint8_t>(pieces_[piece_][offset_])} << (8 * i);
      Advance(1);
    }
    *value = v;
    return true;
  }

  // The next n bytes as a range of the pieces.
  bool Take(uint64_t n, ByteRange* out) {
    if (n > remaining_) return false;
    while (n > 0) {
      const std::string_view piece = pieces_[piece_].substr(offset_);
      const size_t take = std::min<uint64_t>(n, piece.size());
      out->Append(piece.substr(0, take));
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    remaining_ -= n;
    if (offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (piece_ < pieces_.size() && pieces_[piece_].empty()) ++piece_;
  }

  Pieces pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
  uint64_t remaining_ = 0;
};

struct Field {
  uint32_t number = 0;
  int wire = 0;
  uint64_t scalar = 0;  // varint and fixed fields
  ByteRange bytes;      // length-delimited fields
};

absl::Status Malformed(std::string_view message, std::string_view what) {
  std::string text = "malformed ";
  text.append(message).append(": ").append(what);
  return absl::InvalidArgumentError(text);
}

// Calls on_field(Field) for each field of the message in `pieces`; an on_field that
// returns an absl::Status ends the parse at its first error, which is returned.
template <typename OnField>
absl::Status ForEachField(Pieces pieces, std::string_view message, OnField on_field) {
  Reader r(pieces);
  while (!r.AtEnd()) {
    uint64_t tag = 0;
    if (!r.Varint(&tag, 5)) return Malformed(message, "truncated or overlong field tag");
    if (tag > UINT32_MAX || (tag >> 3) == 0) return Malformed(message, "invalid field number");
    Field f;
    f.number = static_cast<uint32_t>(tag >> 3);
    f.wire = static_cast<int>(tag & 7);
    bool ok = false;
    switch (f.wire) {
      case kVarint:
        ok = r.Varint(&f.scalar);
        break;
      case kFixed64:
        ok = r.Fixed(8, &f.scalar);
        break;
      case kFixed32:
        ok = r.Fixed(4, &f.scalar);
        break;
      case kLengthDelimited: {
        uint64_t n = 0;
        ok = r.Varint(&n) && r.Take(n, &f.bytes);
        break;
      }
      default:
        return Malformed(message, absl::StrCat("field ", f.number, " has wire type ", f.wire,
                                               ", which no ps.v1 message uses"));
    }
    if (!ok) return Malformed(message, absl::StrCat("field ", f.number, " is truncated"));
    if constexpr (std::is_same_v<std::invoke_result_t<OnField, Field>, absl::Status>) {
      if (absl::Status st = on_field(std::move(f)); !st.ok()) return st;
    } else {
      on_field(std::move(f));
    }
  }
  return absl::OkStatus();
}

// Appends the entries of a repeated varint field to `out`: one entry (wire type varint)
// or a packed run (length-delimited), as protobuf writes either. Refuses the entry that
// would make `out` longer than `max`, before reading further.
template <typename T>
absl::Status AppendRepeated(const Field& f, std::string_view message, std::string_view name,
                            size_t max, std::vector<T>* out) {
  auto too_many = [&] {
    std::string what = absl::StrCat("more than ", max, " ");
    what.append(name).append(", the most this shard takes (each of its slices once)");
    return Malformed(message, what);
  };
  if (f.wire == kVarint) {
    if (out->size() >= max) return too_many();
    out->push_back(static_cast<T>(f.scalar));
    return absl::OkStatus();
  }
  if (f.wire != kLengthDelimited) return absl::OkStatus();  // another wire type: skipped
  Reader r(f.bytes.parts());
  while (!r.AtEnd()) {
    if (out->size() >= max) return too_many();
    uint64_t v = 0;
    if (!r.Varint(&v)) {
      std::string what = "packed ";
      what.append(name).append(" end inside a varint");
      return Malformed(message, what);
    }
    out->push_back(static_cast<T>(v));
  }
  return absl::OkStatus();
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void AppendFixed64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void AppendTag(uint32_t number, int wire, std::string* out) {
  AppendVarint((uint64_t{number} << 3) | static_cast<uint64_t>(wire), out);
}

// A float field (wire type fixed32: its IEEE bits, little-endian), when present.
void AppendFloatField(uint32_t number, std::optional<float> v, std::string* out) {
  if (!v.has_value()) return;
  AppendTag(number, kFixed32, out);
  const uint32_t bits = std::bit_cast<uint32_t>(*v);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(bits >> (8 * i)));
}

float FloatOf(uint64_t fixed32) { return std::bit_cast<float>(static_cast<uint32_t>(fixed32)); }

void AppendBytesField(uint32_t number, std::string_view bytes, std::string* out) {
  AppendTag(number, kLengthDelimited, out);
  AppendVarint(bytes.size(), out);
  out->append(bytes);
}

}  // namespace

absl::StatusOr<PullFrame> ParsePullResponse(Pieces pieces) {
  PullFrame frame;
  absl::Status s = ForEachField(pieces, "PullResponse", [&frame](Field f) {
    if (f.number == 1 && f.wire == kVarint) frame.slice_id = static_cast<uint32_t>(f.scalar);
    if (f.number == 2 && f.wire == kVarint) frame.version = f.scalar;
    if (f.number == 3 && f.wire == kLengthDelimited) frame.values = std::move(f.bytes);
    if (f.number == 4 && f.wire == kLengthDelimited) frame.codec = std::move(f.bytes);
    if (f.number == 5 && f.wire == kVarint) frame.base_version = f.scalar;
    if (f.number == 6 && f.wire == kFixed64) frame.epoch = f.scalar;
    if (f.number == 7 && f.wire == kFixed32) frame.loss = FloatOf(f.scalar);
    if (f.number == 8 && f.wire == kFixed32) frame.first_loss = FloatOf(f.scalar);
    if (f.number == 9 && f.wire == kVarint) frame.queued = f.scalar != 0;
  });
  if (!s.ok()) return s;
  return frame;
}

absl::StatusOr<PushFrame> ParsePushRequest(Pieces pieces) {
  PushFrame frame;
  absl::Status s = ForEachField(pieces, "PushRequest", [&frame](Field f) {
    if (f.number == 1 && f.wire == kLengthDelimited) frame.session = std::move(f.bytes);
    if (f.number == 2 && f.wire == kFixed64) frame.layout_hash = f.scalar;
    if (f.number == 3 && f.wire == kVarint) frame.round = f.scalar;
    if (f.number == 4 && f.wire == kVarint) frame.slice_id = static_cast<uint32_t>(f.scalar);
    if (f.number == 5 && f.wire == kLengthDelimited) frame.codec = std::move(f.bytes);
    if (f.number == 6 && f.wire == kLengthDelimited) frame.payload = std::move(f.bytes);
    if (f.number == 7 && f.wire == kFixed32) frame.loss = FloatOf(f.scalar);
    if (f.number == 8 && f.wire == kFixed32) frame.lr = FloatOf(f.scalar);
  });
  if (!s.ok()) return s;
  return frame;
}

absl::StatusOr<PullRequestFrame> ParsePullRequest(Pieces pieces, size_t max_slices) {
  constexpr std::string_view kMessage = "PullRequest";
  PullRequestFrame frame;
  absl::Status s = ForEachField(pieces, kMessage, [&](Field f) -> absl::Status {
    switch (f.number) {
      case 1:
        if (f.wire == kLengthDelimited) frame.session = std::move(f.bytes);
        break;
      case 2:
        if (f.wire == kFixed64) frame.layout_hash = f.scalar;
        break;
      case 3:
        return AppendRepeated(f, kMessage, "slice ids", max_slices, &frame.slice_ids);
      case 4:
        if (f.wire == kVarint) frame.min_version = f.scalar;
        break;
      case 5:
        return AppendRepeated(f, kMessage, "held versions", max_slices, &frame.held_versions);
      case 6:
        if (f.wire == kFixed64) frame.held_epoch = f.scalar;
        break;
      default:
        break;
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return frame;
}

std::string PullResponseHeader(const PullHeader& header, size_t values_size) {
  std::string out;
  out.reserve(48 + header.codec.size());
  AppendTag(1, kVarint, &out);
  AppendVarint(header.slice_id, &out);
  AppendTag(2, kVarint, &out);
  AppendVarint(header.version, &out);
  if (!header.codec.empty()) AppendBytesField(4, header.codec, &out);
  if (header.base_version != 0) {
    AppendTag(5, kVarint, &out);
    AppendVarint(header.base_version, &out);
  }
  if (header.epoch != 0) {
    AppendTag(6, kFixed64, &out);
    AppendFixed64(header.epoch, &out);
  }
  AppendFloatField(7, header.loss, &out);
  AppendFloatField(8, header.first_loss, &out);
  if (header.queued) {
    AppendTag(9, kVarint, &out);
    AppendVarint(1, &out);
  }
  AppendTag(3, kLengthDelimited, &out);
  AppendVarint(values_size, &out);
  return out;
}

std::string PushRequestHeader(std::string_view session, uint64_t layout_hash, uint64_t round,
                              uint32_t slice_id, std::string_view codec, size_t payload_size,
                              std::optional<float> loss, std::optional<float> lr) {
  std::string out;
  out.reserve(56 + session.size() + codec.size());
  AppendBytesField(1, session, &out);
  AppendTag(2, kFixed64, &out);
  AppendFixed64(layout_hash, &out);
  AppendTag(3, kVarint, &out);
  AppendVarint(round, &out);
  AppendTag(4, kVarint, &out);
  AppendVarint(slice_id, &out);
  AppendBytesField(5, codec, &out);
  AppendFloatField(7, loss, &out);
  AppendFloatField(8, lr, &out);
  AppendTag(6, kLengthDelimited, &out);
  AppendVarint(payload_size, &out);
  return out;
}

}  // namespace ps::net
