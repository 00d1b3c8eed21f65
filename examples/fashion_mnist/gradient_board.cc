// The gradient boards of omniscient attacks (training.h): in one process, and across
// processes through a directory.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "examples/fashion_mnist/training.h"

namespace ps::fashion_mnist {

using Clock = std::chrono::steady_clock;

absl::Status SharedGradientBoard::Publish(uint64_t round, uint32_t worker_id,
                                          std::vector<float> gradient) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    rounds_[round][worker_id] = std::move(gradient);
    while (!rounds_.empty() && rounds_.begin()->first + 3 < round) rounds_.erase(rounds_.begin());
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> SharedGradientBoard::Collect(
    uint64_t round, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool complete = changed_.wait_for(lock, timeout, [&] {
    auto it = rounds_.find(round);
    return it != rounds_.end() && it->second.size() >= expected_;
  });
  if (!complete) {
    return absl::DeadlineExceededError(
        absl::StrCat("round ", round, ": the honest gradients did not all arrive"));
  }
  std::vector<std::vector<float>> out;
  for (const auto& [worker, g] : rounds_[round]) out.push_back(g);  // copies: others read too
  return out;
}

std::string DirectoryGradientBoard::Path(uint64_t round, uint32_t worker_id) const {
  return absl::StrCat(dir_, "/round-", round, "-worker-", worker_id, ".f32");
}

absl::Status DirectoryGradientBoard::Publish(uint64_t round, uint32_t worker_id,
                                             std::vector<float> gradient) {
  const std::string path = Path(round, worker_id);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(gradient.data()),
              static_cast<std::streamsize>(gradient.size() * sizeof(float)));
    if (!out) return absl::UnavailableError(absl::StrCat("side channel: cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("side channel: cannot rename to ", path, ": ", ec.message()));
  written_.emplace_back(round, worker_id);
  while (!written_.empty() && written_.front().first + 2 < round) {
    std::filesystem::remove(Path(written_.front().first, written_.front().second), ec);
    written_.erase(written_.begin());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> DirectoryGradientBoard::Collect(
    uint64_t round, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string prefix = absl::StrCat("round-", round, "-worker-");
  while (true) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".f32") {
        files.push_back(entry.path().string());
      }
    }
    if (ec)
      return absl::UnavailableError(
          absl::StrCat("side channel: cannot list ", dir_, ": ", ec.message()));
    if (files.size() >= expected_) {
      std::sort(files.begin(), files.end());
      std::vector<std::vector<float>> out;
      for (const std::string& f : files) {
        std::ifstream in(f, std::ios::binary);
        std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
        std::vector<float> g(bytes.size() / sizeof(float));
        std::memcpy(g.data(), bytes.data(), g.size() * sizeof(float));
        out.push_back(std::move(g));
      }
      return out;
    }
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("side channel: round ", round, " has ",
                                                      files.size(), " of ", expected_,
                                                      " gradients in ", dir_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace ps::fashion_mnist
