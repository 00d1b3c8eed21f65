#include "server/pull_delta.h"

#include <utility>

#include "core/fp32_bytes.h"
#include "core/scratch.h"

namespace ps::server {

absl::StatusOr<std::shared_ptr<codecs::Codec>> MakePullCodec(const std::string& spec) {
  if (spec.empty()) return std::shared_ptr<codecs::Codec>();
  absl::StatusOr<std::unique_ptr<codecs::Codec>> codec = codecs::MakeCodec(spec);
  if (!codec.ok()) return codec.status();
  return std::shared_ptr<codecs::Codec>(*std::move(codec));
}

absl::StatusOr<std::shared_ptr<const std::string>> EncodeChange(std::span<const float> x,
                                                                uint32_t slice_id, uint64_t version,
                                                                HeldValues& held) {
  struct ChangeTag;
  const std::span<float> change = core::ThreadScratch<float, ChangeTag>(x.size());
  core::Subtract(x, held.values, change);
  codecs::EncodeContext ctx;
  ctx.round = version;
  ctx.slice_id = slice_id;
  ctx.worker_id = UINT32_MAX;  // the shard's own stream of any random choices
  auto payload = std::make_shared<std::string>();
  absl::Status st = held.codec->Encode(change, ctx, payload.get());
  // What a worker will do with the payload, exactly: decode, then add.
  if (st.ok()) st = held.codec->Decode(*payload, change);
  if (!st.ok()) {
    held.values.assign(x.begin(), x.end());
    return st;
  }
  core::AddInto(held.values, change);
  return std::shared_ptr<const std::string>(std::move(payload));
}

}  // namespace ps::server
