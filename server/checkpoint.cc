#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "core/client_text.h"
#include "core/status.h"
#include "net/layout_proto.h"
#include "ps/v1/checkpoint.pb.h"
#include "server/options.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr size_t kHeaderBytes = 16;
constexpr size_t kDigestBytes = SHA256_DIGEST_LENGTH;
constexpr absl::string_view kPrefix = "checkpoint-";
constexpr absl::string_view kSuffix = ".pscp";

std::string Floats(const std::vector<float>& v) {
  std::string out(v.size() * sizeof(float), '\0');
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

absl::Status ToFloats(const std::string& bytes, size_t numel_multiple, std::vector<float>* out,
                      std::string_view what, uint32_t slice_id) {
  if (bytes.size() % sizeof(float) != 0 ||
      (numel_multiple != 0 && (bytes.size() / sizeof(float)) % numel_multiple != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", slice_id, ": ", core::AsAbsl(what),
                                                   " has ", bytes.size(), " bytes"));
  }
  out->resize(bytes.size() / sizeof(float));
  if (!bytes.empty()) std::memcpy(out->data(), bytes.data(), bytes.size());
  for (float f : *out) {
    if (!std::isfinite(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", slice_id, ": ", core::AsAbsl(what), " is not finite"));
    }
  }
  return absl::OkStatus();
}

// A score or one of its parts: in [0, 1] (an alignment in [-1, 1]), or NaN (none yet).
bool ScoreOk(double v, double low) { return std::isnan(v) || (v >= low && v <= 1.0); }

absl::Status DecodeWorkers(const v1::ShardCheckpoint& msg, ShardCheckpoint* c) {
  int64_t previous = -1;
  for (const v1::WorkerCheckpoint& w : msg.workers()) {
    const std::string where = absl::StrCat("checkpoint worker ", w.worker());
    if (w.worker() >= kMaxWorkerIds || static_cast<int64_t>(w.worker()) <= previous) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ids must increase and stay below ", kMaxWorkerIds));
    }
    previous = w.worker();
    WorkerCheckpoint out;
    out.worker = w.worker();
    if (w.state() == "present") {
      out.state = Membership::State::kPresent;
    } else if (w.state() == "left") {
      out.state = Membership::State::kLeft;
    } else if (w.state() == "expired") {
      out.state = Membership::State::kExpired;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": state '",
                                                     core::ClientText(w.state(), 32),
                                                     "' is not present, left or expired"));
    }
    if (!ScoreOk(w.score(), 0.0) || !ScoreOk(w.set_aside(), 0.0) ||
        !ScoreOk(w.alignment(), -1.0) || !std::isfinite(w.share_sum()) || w.share_sum() < 0 ||
        w.windows_suspected() > w.windows()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": suspicion out of range"));
    }
    out.suspicion = WorkerSuspicion{.score = w.score(),
                                    .set_aside = w.set_aside(),
                                    .alignment = w.alignment(),
                                    .suspected = w.suspected(),
                                    .slice_rounds_weighed = w.slice_rounds_weighed(),
                                    .share_sum = w.share_sum(),
                                    .windows = w.windows(),
                                    .windows_suspected = w.windows_suspected()};
    c->workers.push_back(out);
  }
  if (static_cast<size_t>(msg.suspicion_history_size()) > Suspicion::kHistoryWindows) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint holds ",
                                                   msg.suspicion_history_size(),
                                                   " suspicion windows; at most ",
                                                   Suspicion::kHistoryWindows));
  }
  for (const v1::SuspicionWindow& w : msg.suspicion_history()) {
    const int n = w.scores_size();
    if (n > static_cast<int>(kMaxWorkerIds) || w.set_aside_size() != n ||
        w.alignment_size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint suspicion window at round ", w.first_round(), ": sizes differ or exceed ",
          kMaxWorkerIds, " workers"));
    }
    for (int i = 0; i < n; ++i) {
      if (!ScoreOk(w.scores(i), 0.0) || !ScoreOk(w.set_aside(i), 0.0) ||
          !ScoreOk(w.alignment(i), -1.0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint suspicion window at round ", w.first_round(), ": worker ", i,
            "'s score out of range"));
      }
    }
    c->suspicion_history.push_back(
        Suspicion::Window{w.first_round(),
                          std::vector<double>(w.scores().begin(), w.scores().end()),
                          std::vector<double>(w.set_aside().begin(), w.set_aside().end()),
                          std::vector<double>(w.alignment().begin(), w.alignment().end())});
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(std::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(core::AsAbsl(what), " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAllAndSync(const std::string& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status st = ErrnoError("cannot write", path);
      ::close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status st = ErrnoError("cannot fsync", path);
    ::close(fd);
    return st;
  }
  if (::close(fd) != 0) return ErrnoError("cannot close", path);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace

uint64_t ShardCheckpoint::MaxVersion() const {
  uint64_t v = 0;
  for (const SliceCheckpoint& s : slices) v = std::max(v, s.version);
  return v;
}

std::string EncodeCheckpoint(const ShardCheckpoint& c) {
  v1::ShardCheckpoint msg;
  msg.set_shard_id(c.shard_id);
  msg.set_num_shards(c.num_shards);
  msg.set_config_summary(c.config_summary);
  msg.set_run_id(c.run_id);
  msg.set_written_unix_s(c.written_unix_s);
  if (c.layout.has_value()) {
    msg.set_layout_hash(c.layout->hash());
    net::LayoutToProto(*c.layout, msg.mutable_layout());
  }
  for (const SliceCheckpoint& s : c.slices) {
    v1::SliceCheckpoint* out = msg.add_slices();
    out->set_slice_id(s.slice_id);
    out->set_version(s.version);
    out->set_values(s.values);
    out->set_velocity(Floats(s.velocity));
    out->set_rule_state(Floats(s.rule_state));
    out->set_params(Floats(s.params));
    out->set_second_moment(Floats(s.second_moment));
    out->set_optimizer_steps(s.optimizer_steps);
  }
  for (const WorkerCheckpoint& w : c.workers) {
    v1::WorkerCheckpoint* out = msg.add_workers();
    out->set_worker(w.worker);
    out->set_state(std::string(MembershipStateName(w.state)));
    const WorkerSuspicion& s = w.suspicion;
    out->set_score(s.score);
    out->set_set_aside(s.set_aside);
    out->set_alignment(s.alignment);
    out->set_suspected(s.suspected);
    out->set_slice_rounds_weighed(s.slice_rounds_weighed);
    out->set_share_sum(s.share_sum);
    out->set_windows(s.windows);
    out->set_windows_suspected(s.windows_suspected);
  }
  for (const Suspicion::Window& w : c.suspicion_history) {
    v1::SuspicionWindow* out = msg.add_suspicion_history();
    out->set_first_round(w.first_round);
    out->mutable_scores()->Add(w.scores.begin(), w.scores.end());
    out->mutable_set_aside()->Add(w.set_aside.begin(), w.set_aside.end());
    out->mutable_alignment()->Add(w.alignment.begin(), w.alignment.end());
  }
  return FrameCheckpoint(msg.SerializeAsString());
}

std::string FrameCheckpoint(std::string_view body) {
  std::string file(kMagic, sizeof(kMagic));
  const uint64_t n = body.size();
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  file.append(body.data(), body.size());
  unsigned char md[kDigestBytes];
  SHA256(reinterpret_cast<const unsigned char*>(file.data()), file.size(), md);
  file.append(reinterpret_cast<const char*>(md), kDigestBytes);
  return file;
}

absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(std::string_view file) {
  if (file.size() < kHeaderBytes + kDigestBytes ||
      std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("not a ps-server checkpoint (bad magic or truncated header)");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(file[8 + i])} << (8 * i);
  if (n != file.size() - kHeaderBytes - kDigestBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint length field says ", n,
                                            " body bytes, the file holds ",
                                            file.size() - kHeaderBytes - kDigestBytes,
                                            " (truncated or torn write)"));
  }
  unsigned char md[kDigestBytes];
  SHA256(reinterpret_cast<const unsigned char*>(file.data()), file.size() - kDigestBytes, md);
  if (std::memcmp(md, file.data() + file.size() - kDigestBytes, kDigestBytes) != 0) {
    return absl::DataLossError("checkpoint checksum mismatch (the file is corrupted)");
  }
  v1::ShardCheckpoint msg;
  if (!msg.ParseFromArray(file.data() + kHeaderBytes, static_cast<int>(n))) {
    return absl::DataLossError("checkpoint body does not parse");
  }
  ShardCheckpoint c;
  c.shard_id = msg.shard_id();
  c.num_shards = msg.num_shards();
  c.config_summary = msg.config_summary();
  c.run_id = msg.run_id();
  c.written_unix_s = msg.written_unix_s();
  if (c.num_shards == 0 || c.num_shards > core::kMaxShards || c.shard_id >= c.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint names shard ", c.shard_id, " of ", c.num_shards));
  }
  PS_RETURN_IF_ERROR(DecodeWorkers(msg, &c));
  if (!msg.has_layout()) {
    if (msg.slices_size() != 0) return absl::InvalidArgumentError("checkpoint has slices but no layout");
    return c;
  }
  absl::StatusOr<core::ModelLayout> layout = net::LayoutFromProto(msg.layout());
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint layout is invalid: ", layout.status().message()));
  }
  if (layout->hash() != msg.layout_hash()) {
    return absl::InvalidArgumentError("checkpoint layout does not match its hash");
  }
  if (layout->num_shards() != c.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint layout is cut for ",
                                                   layout->num_shards(), " shards, not ",
                                                   c.num_shards));
  }
  const auto owned_span = layout->SlicesOfShard(c.shard_id);
  const std::set<uint32_t> owned(owned_span.begin(), owned_span.end());
  std::set<uint32_t> seen;
  for (const v1::SliceCheckpoint& s : msg.slices()) {
    if (!owned.contains(s.slice_id()) || !seen.insert(s.slice_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint slice ", s.slice_id(), " is not owned by shard ", c.shard_id, " or repeated"));
    }
    const uint32_t numel = layout->slices()[s.slice_id()].numel;
    SliceCheckpoint out;
    out.slice_id = s.slice_id();
    out.version = s.version();
    if (s.values().size() != size_t{numel} * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", s.slice_id(), ": values have ",
                                                     s.values().size(), " bytes, want ",
                                                     size_t{numel} * sizeof(float)));
    }
    std::vector<float> values;
    PS_RETURN_IF_ERROR(ToFloats(s.values(), numel, &values, "values", s.slice_id()));
    out.values = s.values();
    PS_RETURN_IF_ERROR(ToFloats(s.velocity(), numel, &out.velocity, "velocity", s.slice_id()));
    if (!out.velocity.empty() && out.velocity.size() != numel) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", s.slice_id(), ": velocity size"));
    }
    PS_RETURN_IF_ERROR(ToFloats(s.rule_state(), numel, &out.rule_state, "rule state", s.slice_id()));
    PS_RETURN_IF_ERROR(ToFloats(s.params(), numel, &out.params, "parameters", s.slice_id()));
    if (!out.params.empty() && out.params.size() != numel) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", s.slice_id(), ": parameters size"));
    }
    PS_RETURN_IF_ERROR(
        ToFloats(s.second_moment(), numel, &out.second_moment, "second moment", s.slice_id()));
    if (!out.second_moment.empty() && out.second_moment.size() != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", s.slice_id(), ": second moment size"));
    }
    out.optimizer_steps = s.optimizer_steps();
    c.slices.push_back(std::move(out));
  }
  if (seen.size() != owned.size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint holds ", seen.size(), " of the ",
                                                   owned.size(), " slices shard ", c.shard_id,
                                                   " owns"));
  }
  c.layout = *std::move(layout);
  return c;
}

CheckpointStore::CheckpointStore(std::string dir, uint32_t shard_id, uint32_t keep)
    : shard_dir_(absl::StrCat(dir, "/shard-", shard_id)), keep_(std::max<uint32_t>(keep, 1)) {}

absl::StatusOr<std::vector<std::string>> CheckpointStore::List() const {
  std::vector<std::string> names;
  DIR* d = ::opendir(shard_dir_.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return names;
    return ErrnoError("cannot read checkpoint directory", shard_dir_);
  }
  while (dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (name.size() == kPrefix.size() + 20 + kSuffix.size() && absl::StartsWith(name, kPrefix) &&
        absl::EndsWith(name, kSuffix)) {
      names.emplace_back(name);
    }
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());  // zero-padded versions sort as numbers
  for (std::string& n : names) n = absl::StrCat(shard_dir_, "/", n);
  return names;
}

absl::StatusOr<std::string> CheckpointStore::Write(const ShardCheckpoint& checkpoint) {
  std::error_code ec;
  std::filesystem::create_directories(shard_dir_, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create checkpoint directory ", shard_dir_, ": ", ec.message()));
  }
  const std::string path =
      absl::StrCat(shard_dir_, "/", kPrefix, absl::StrFormat("%020d", checkpoint.MaxVersion()), kSuffix);
  const std::string tmp = path + ".tmp";
  PS_RETURN_IF_ERROR(WriteAllAndSync(tmp, EncodeCheckpoint(checkpoint)));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status st = ErrnoError("cannot rename checkpoint into place:", path);
    ::unlink(tmp.c_str());
    return st;
  }
  PS_RETURN_IF_ERROR(SyncDirectory(shard_dir_));
  PS_ASSIGN_OR_RETURN(std::vector<std::string> all, List());
  for (size_t i = 0; i + keep_ < all.size(); ++i) {
    if (::unlink(all[i].c_str()) != 0) {
      spdlog::warn("cannot delete old checkpoint {}: {}", all[i], std::strerror(errno));
    }
  }
  return path;
}

absl::StatusOr<std::optional<CheckpointStore::Loaded>> CheckpointStore::LoadLatest() const {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> all, List());
  Loaded loaded;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    absl::StatusOr<std::string> bytes = [&]() -> absl::StatusOr<std::string> {
      const int fd = ::open(it->c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return ErrnoError("cannot open", *it);
      std::string data;
      char buf[1 << 16];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          absl::Status st = ErrnoError("cannot read", *it);
          ::close(fd);
          return st;
        }
        if (n == 0) break;
        data.append(buf, static_cast<size_t>(n));
      }
      ::close(fd);
      return data;
    }();
    absl::StatusOr<ShardCheckpoint> c =
        bytes.ok() ? DecodeCheckpoint(*bytes) : absl::StatusOr<ShardCheckpoint>(bytes.status());
    if (!c.ok()) {
      spdlog::error("checkpoint {} is unusable, trying the previous one: {}", *it,
                    std::string(c.status().message()));
      loaded.skipped.push_back(absl::StrCat(*it, ": ", c.status().message()));
      continue;
    }
    loaded.checkpoint = *std::move(c);
    loaded.path = *it;
    return std::optional<Loaded>(std::move(loaded));
  }
  return std::optional<Loaded>();
}

}  // namespace ps::server
