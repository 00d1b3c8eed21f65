// Fuzz target for the in-place readers of net/wire.h: ParsePullResponse (what a worker
// does with every message of a pull stream), ParsePushRequest (what a shard does with
// every push) and ParsePullRequest (with every pull), which read the protobuf wire format
// across the pieces gRPC received.
//
// Input: byte 0 selects the message (modulo 3: 0 PullResponse, 1 PushRequest, 2
// PullRequest; for a PullRequest, byte 0 / 3 is also the bound on its slice ids); byte 1
// is where the body is cut into two pieces (modulo its size + 1) and byte 2 where the
// second piece is cut again; the rest is the body.
// A PullRequest is parsed with that bound and without one: with it, the parse must
// accept exactly when the unbounded one does and both lists are within the bound, and
// then say the same.
// The reader must not crash and must refuse with INVALID_ARGUMENT "malformed <Type>".
// When it accepts, every byte range lies inside the input and is made of non-empty
// parts, and protobuf's own parser accepts the same bytes with the same fields (codec
// strings that are not UTF-8 aside, in any occurrence, which protobuf refuses and the
// shard refuses as an unknown codec); the header written from the parsed fields, followed by the tensor
// bytes, parses with protobuf to the same fields again.
// Seeds: tests/fuzz/corpus/wire/ (tests/fuzz/make_corpus.py).
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/unknown_field_set.h"
#include "net/wire.h"
#include "ps/v1/ps.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckInside(const ps::net::ByteRange& range, std::string_view body) {
  size_t total = 0;
  for (std::string_view part : range.parts()) {
    PS_FUZZ_CHECK(!part.empty(), "an empty part in a byte range");
    PS_FUZZ_CHECK(
        part.data() >= body.data() && part.data() + part.size() <= body.data() + body.size(),
        "a byte range outside the input");
    total += part.size();
  }
  PS_FUZZ_CHECK(total == range.size(), "a byte range's size is not its parts'");
}

void CheckRefusal(const absl::Status& s, std::string_view type) {
  PS_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "refused with another code");
  const std::string want = "malformed " + std::string(type);
  PS_FUZZ_CHECK(std::string_view(s.message().data(), s.message().size()).starts_with(want),
                "refusal does not name the message");
}

bool Utf8(const std::string& s) {
  ps::v1::PushRequest probe;
  probe.set_codec(s);
  ps::v1::PushRequest back;
  return back.ParseFromString(probe.SerializeAsString());
}

// Whether every occurrence of string field `number` in `bytes` is UTF-8 (protobuf
// refuses the message otherwise, even when a later occurrence replaces the bad one).
bool EveryOccurrenceUtf8(const std::string& bytes, int number) {
  ps::v1::PushResponse empty;  // no fields: every field of `bytes` stays unknown
  if (!empty.ParseFromString(bytes)) return true;
  const google::protobuf::UnknownFieldSet& unknown =
      empty.GetReflection()->GetUnknownFields(empty);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() == number && f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
        !Utf8(f.length_delimited())) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size < 3) return 0;
  const int kind = data[0] % 3;
  const bool push = kind == 1;
  const std::string_view body(reinterpret_cast<const char*>(data) + 3, size - 3);
  const size_t a = data[1] % (body.size() + 1);
  const size_t b = a + data[2] % (body.size() - a + 1);
  const std::string_view pieces[] = {body.substr(0, a), body.substr(a, b - a), body.substr(b)};
  const std::string bytes(body);

  if (kind == 2) {
    const size_t bound = data[0] / 3;
    absl::StatusOr<ps::net::PullRequestFrame> all = ps::net::ParsePullRequest(pieces, SIZE_MAX);
    absl::StatusOr<ps::net::PullRequestFrame> f = ps::net::ParsePullRequest(pieces, bound);
    if (!f.ok()) CheckRefusal(f.status(), "PullRequest");
    if (!all.ok()) {
      CheckRefusal(all.status(), "PullRequest");
      PS_FUZZ_CHECK(!f.ok(), "a bounded parse accepted what the unbounded one refused");
      return 0;
    }
    const bool within = all->slice_ids.size() <= bound && all->held_versions.size() <= bound;
    PS_FUZZ_CHECK(f.ok() == within, "the bound refused a request within it, or let one past");
    CheckInside(all->session, body);
    ps::v1::PullRequest m;
    PS_FUZZ_CHECK(m.ParseFromString(bytes), "accepted a PullRequest protobuf refuses");
    PS_FUZZ_CHECK(m.session() == all->session.ToString() && m.layout_hash() == all->layout_hash &&
                      m.min_version() == all->min_version && m.held_epoch() == all->held_epoch &&
                      std::equal(m.slice_ids().begin(), m.slice_ids().end(),
                                 all->slice_ids.begin(), all->slice_ids.end()) &&
                      std::equal(m.held_versions().begin(), m.held_versions().end(),
                                 all->held_versions.begin(), all->held_versions.end()),
                  "PullRequest fields differ from protobuf's");
    if (f.ok()) {
      PS_FUZZ_CHECK(f->slice_ids == all->slice_ids && f->held_versions == all->held_versions &&
                        f->session.ToString() == all->session.ToString() &&
                        f->min_version == all->min_version,
                    "the bounded parse says something else");
    }
    return 0;
  }

  if (!push) {
    absl::StatusOr<ps::net::PullFrame> f = ps::net::ParsePullResponse(pieces);
    if (!f.ok()) {
      CheckRefusal(f.status(), "PullResponse");
      return 0;
    }
    CheckInside(f->values, body);
    CheckInside(f->codec, body);
    ps::v1::PullResponse m;
    const std::string codec = f->codec.ToString();
    if (!EveryOccurrenceUtf8(bytes, 4)) return 0;
    PS_FUZZ_CHECK(m.ParseFromString(bytes), "accepted a PullResponse protobuf refuses");
    PS_FUZZ_CHECK(m.slice_id() == f->slice_id && m.version() == f->version &&
                      m.values() == f->values.ToString() && m.codec() == codec &&
                      m.base_version() == f->base_version && m.epoch() == f->epoch,
                  "PullResponse fields differ from protobuf's");
    ps::v1::PullResponse again;
    PS_FUZZ_CHECK(
        again.ParseFromString(ps::net::PullResponseHeader(ps::net::PullHeader{*f, codec},
                                                          f->values.size()) +
                              f->values.ToString()),
        "a written PullResponse does not parse");
    PS_FUZZ_CHECK(again.slice_id() == m.slice_id() && again.version() == m.version() &&
                      again.values() == m.values() && again.codec() == m.codec() &&
                      again.base_version() == m.base_version() && again.epoch() == m.epoch() &&
                      again.has_loss() == m.has_loss() &&
                      again.has_first_loss() == m.has_first_loss() &&
                      again.queued() == m.queued(),
                  "a written PullResponse changed its fields");
    return 0;
  }

  absl::StatusOr<ps::net::PushFrame> f = ps::net::ParsePushRequest(pieces);
  if (!f.ok()) {
    CheckRefusal(f.status(), "PushRequest");
    return 0;
  }
  for (const ps::net::ByteRange* r : {&f->session, &f->codec, &f->payload}) CheckInside(*r, body);
  const std::string codec = f->codec.ToString();
  if (!EveryOccurrenceUtf8(bytes, 5)) return 0;
  ps::v1::PushRequest m;
  PS_FUZZ_CHECK(m.ParseFromString(bytes), "accepted a PushRequest protobuf refuses");
  PS_FUZZ_CHECK(m.session() == f->session.ToString() && m.layout_hash() == f->layout_hash &&
                    m.round() == f->round && m.slice_id() == f->slice_id && m.codec() == codec &&
                    m.payload() == f->payload.ToString(),
                "PushRequest fields differ from protobuf's");
  // The optional floats, bit for bit (a NaN's payload included).
  const auto same_bits = [](const std::optional<float>& a, bool has, float b) {
    return a.has_value() == has &&
           (!has || std::bit_cast<uint32_t>(*a) == std::bit_cast<uint32_t>(b));
  };
  PS_FUZZ_CHECK(same_bits(f->loss, m.has_loss(), m.loss()) && same_bits(f->lr, m.has_lr(), m.lr()),
                "PushRequest loss or lr differs from protobuf's");
  ps::v1::PushRequest again;
  PS_FUZZ_CHECK(again.ParseFromString(ps::net::PushRequestHeader(m.session(), m.layout_hash(),
                                                                 m.round(), m.slice_id(), m.codec(),
                                                                 m.payload().size(), f->loss,
                                                                 f->lr) +
                                      m.payload()),
                "a written PushRequest does not parse");
  PS_FUZZ_CHECK(again.session() == m.session() && again.layout_hash() == m.layout_hash() &&
                    again.round() == m.round() && again.slice_id() == m.slice_id() &&
                    again.codec() == m.codec() && again.payload() == m.payload() &&
                    same_bits(f->lr, again.has_lr(), again.lr()) &&
                    same_bits(f->loss, again.has_loss(), again.loss()),
                "a written PushRequest changed its fields");
  return 0;
}
