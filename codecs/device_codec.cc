// OnCuda (device_internal.h): the codec MakeCodec returns when CodecOptions::device asks
// for CUDA.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/device_internal.h"

namespace ps::codecs::internal {
namespace {

class CudaRequestedCodec final : public Codec {
 public:
  // `device` may be null: then Encode runs on `cpu` and `note` says why.
  CudaRequestedCodec(std::unique_ptr<Codec> cpu, std::unique_ptr<DeviceEncode> device,
                     std::string note)
      : Codec(cpu->format()), cpu_(std::move(cpu)), device_(std::move(device)), note_(std::move(note)) {}

  std::string_view spec() const override { return cpu_->spec(); }
  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    return device_ != nullptr ? device_->Encode(values, ctx, out) : cpu_->Encode(values, ctx, out);
  }
  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    return cpu_->Decode(bytes, out);
  }
  absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                               std::span<float> held, std::span<float> out) const override {
    return cpu_->DecodeAddPieces(pieces, held, out);
  }
  size_t MaxEncodedBytes(size_t numel) const override { return cpu_->MaxEncodedBytes(numel); }
  SharedStructure shared_structure() const override { return cpu_->shared_structure(); }
  std::string_view device_note() const override { return note_; }

 private:
  std::unique_ptr<Codec> cpu_;
  std::unique_ptr<DeviceEncode> device_;
  std::string note_;
};

}  // namespace

std::unique_ptr<Codec> OnCuda(std::unique_ptr<Codec> cpu, const CodecOptions& options) {
  absl::StatusOr<std::unique_ptr<DeviceEncode>> device = MakeCudaEncode(*cpu, options);
  if (device.ok()) return std::make_unique<CudaRequestedCodec>(std::move(cpu), *std::move(device), "");
  const std::string note =
      device.status().code() == absl::StatusCode::kUnimplemented
          ? absl::StrCat("device=cuda: ", device.status().message(), "; encoding on the CPU")
          : absl::StrCat("device=cuda requested but unavailable (", device.status().message(),
                         "); encoding on the CPU");
  return std::make_unique<CudaRequestedCodec>(std::move(cpu), nullptr, note);
}

}  // namespace ps::codecs::internal
