#include "server/pull_delta.h"

#include <utility>

namespace ps::server {

absl::StatusOr<std::shared_ptr<codecs::Codec>> MakePullCodec(const std::string& spec) {
  if (spec.empty()) return std::shared_ptr<codecs::Codec>();
  absl::StatusOr<std::unique_ptr<codecs::Codec>> codec = codecs::MakeCodec(spec);
  if (!codec.ok()) return codec.status();
  return std::shared_ptr<codecs::Codec>(*std::move(codec));
}

absl::StatusOr<std::shared_ptr<const std::string>> EncodeChange(std::span<const float> x,
                                                                uint32_t slice_id, uint64_t version,
                                                                HeldValues& held,
                                                                std::span<float> copy_to) {
  codecs::EncodeContext ctx;
  ctx.round = version;
  ctx.slice_id = slice_id;
  ctx.worker_id = UINT32_MAX;  // the shard's own stream of any random choices
  auto payload = std::make_shared<std::string>();
  // What a worker will do with the payload, exactly: decode, then add.
  if (absl::Status st = held.codec->EncodeChange(x, held.values, ctx, payload.get(), copy_to);
      !st.ok()) {
    held.values.assign(x.begin(), x.end());
    return st;
  }
  return std::shared_ptr<const std::string>(std::move(payload));
}

}  // namespace ps::server
