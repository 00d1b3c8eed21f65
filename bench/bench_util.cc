#include "bench/bench_util.h"

#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/commands.h"
#include "core/status.h"

namespace ps::bench {
namespace {

// Keeps a value alive and the memory it depends on written, without emitting code.
template <typename T>
void KeepAlive(const T& value) {
  asm volatile("" : : "g"(&value) : "memory");
}

// Eight independent integer lanes: integer addition may be reordered, so the compiler
// vectorizes the loop, and the add chains are short enough that memory is the limit.
__attribute__((noinline)) uint64_t SumWords(const uint64_t* words, size_t count) {
  uint64_t acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (size_t k = 0; k < 8; ++k) acc[k] += words[i + k];
  }
  for (; i < count; ++i) acc[0] += words[i];
  uint64_t total = 0;
  for (uint64_t a : acc) total += a;
  return total;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// sqrt(3) / 65536: the sum of four uniforms on [0, 65535] has standard deviation
// about 65536 / sqrt(3).
constexpr float kGaussianScale = static_cast<float>(1.7320508075688772 / 65536.0);
constexpr size_t kFillBlock = size_t{1} << 16;

// Debian's abseil keeps its own string_view type.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }


}  // namespace

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

double MeasureMemReadGBps(size_t bytes, int repeats) {
  const size_t count = std::max<size_t>(bytes / sizeof(uint64_t), 1);
  auto words = std::make_unique_for_overwrite<uint64_t[]>(count);
  for (size_t i = 0; i < count; ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
  KeepAlive(words[0]);
  double best = std::numeric_limits<double>::infinity();
  uint64_t checksum = 0;
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    const double t0 = NowSeconds();
    checksum += SumWords(words.get(), count);
    best = std::min(best, NowSeconds() - t0);
  }
  KeepAlive(checksum);
  return static_cast<double>(count * sizeof(uint64_t)) / best / 1e9;
}

MemreadBaseline::MemreadBaseline(uint64_t bytes)
    : bytes_(bytes), start_(MeasureMemReadGBps(bytes, 5)) {
  std::fprintf(stderr, "memory read baseline (1 thread, %s bytes): %.2f GB/s\n",
               FormatSize(bytes).c_str(), start_);
}

double MemreadBaseline::Finish() {
  end_ = MeasureMemReadGBps(bytes_, 5);
  return std::max(start_, end_);
}

std::string MemreadBaseline::Describe() const {
  return absl::StrFormat(
      "memory read baseline, 1 thread, %s bytes: %.2f GB/s at start, %.2f GB/s at end; "
      "ratios use the higher, %.2f GB/s",
      FormatSize(bytes_), start_, end_, std::max(start_, end_));
}

absl::StatusOr<Timing> TimeCalls(const std::function<absl::Status()>& fn,
                                 const TimingOptions& options) {
  const double w0 = NowSeconds();
  if (absl::Status st = fn(); !st.ok()) return st;
  const double warm = std::max(NowSeconds() - w0, 1e-9);
  Timing timing;
  timing.calls_per_repeat =
      static_cast<int>(std::clamp(std::ceil(options.min_seconds / warm), 1.0, 1e6));
  std::vector<double> per_call;
  for (int r = 0; r < std::max(options.repeats, 1); ++r) {
    const double t0 = NowSeconds();
    for (int c = 0; c < timing.calls_per_repeat; ++c) {
      if (absl::Status st = fn(); !st.ok()) return st;
    }
    per_call.push_back((NowSeconds() - t0) / timing.calls_per_repeat);
  }
  std::sort(per_call.begin(), per_call.end());
  timing.best_seconds = per_call.front();
  const size_t m = per_call.size();
  timing.median_seconds =
      m % 2 == 1 ? per_call[m / 2] : 0.5 * (per_call[m / 2 - 1] + per_call[m / 2]);
  return timing;
}

std::vector<std::string> SplitList(std::string_view text) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  auto flush = [&] {
    std::string item(absl::StripAsciiWhitespace(current));
    if (!item.empty()) items.push_back(std::move(item));
    current.clear();
  };
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') depth = std::max(depth - 1, 0);
    if (c == ',' && depth == 0) {
      flush();
    } else {
      current += c;
    }
  }
  flush();
  return items;
}

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  absl::string_view stripped = absl::StripAsciiWhitespace(Absl(text));
  text = std::string_view(stripped.data(), stripped.size());
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read size '", Absl(text), "' (use a number, 2^20, 1<<20 or 1M)"));
  };
  uint64_t a = 0, b = 0;
  if (size_t p = text.find('^'); p != std::string_view::npos) {
    if (!absl::SimpleAtoi(Absl(text.substr(0, p)), &a) ||
        !absl::SimpleAtoi(Absl(text.substr(p + 1)), &b)) {
      return bad();
    }
    uint64_t v = 1;
    for (uint64_t i = 0; i < b; ++i) {
      if (a != 0 && v > std::numeric_limits<uint64_t>::max() / a) return bad();
      v *= a;
    }
    return v;
  }
  if (size_t p = text.find("<<"); p != std::string_view::npos) {
    if (!absl::SimpleAtoi(Absl(text.substr(0, p)), &a) ||
        !absl::SimpleAtoi(Absl(text.substr(p + 2)), &b) || b >= 64 ||
        (b > 0 && (a >> (64 - b)) != 0)) {
      return bad();
    }
    return a << b;
  }
  uint64_t unit = 1;
  if (!text.empty()) {
    switch (absl::ascii_toupper(text.back())) {
      case 'K':
        unit = uint64_t{1} << 10;
        break;
      case 'M':
        unit = uint64_t{1} << 20;
        break;
      case 'G':
        unit = uint64_t{1} << 30;
        break;
      default:
        break;
    }
    if (unit != 1) text.remove_suffix(1);
  }
  if (!absl::SimpleAtoi(Absl(text), &a) || a > std::numeric_limits<uint64_t>::max() / unit) {
    return bad();
  }
  return a * unit;
}

absl::StatusOr<std::vector<uint64_t>> ParseSizeList(const std::vector<std::string>& texts) {
  std::vector<uint64_t> values;
  for (const std::string& text : texts) {
    for (const std::string& item : SplitList(text)) {
      absl::StatusOr<uint64_t> v = ParseSize(item);
      if (!v.ok()) return v.status();
      values.push_back(*v);
    }
  }
  return values;
}

absl::StatusOr<std::vector<int>> ParseThreadList(const std::vector<std::string>& texts) {
  std::vector<int> values;
  for (const std::string& text : texts) {
    for (const std::string& item : SplitList(text)) {
      int v = 0;
      if (absl::AsciiStrToLower(item) == "all") {
        v = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      } else if (!absl::SimpleAtoi(item, &v) || v < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot read thread count '", item, "' (a number >= 1 or 'all')"));
      }
      if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
    }
  }
  return values;
}

std::string FormatSize(uint64_t value) {
  if (value >= 1024 && std::has_single_bit(value)) {
    return absl::StrCat("2^", std::countr_zero(value));
  }
  return absl::StrCat(value);
}

std::unique_ptr<core::ThreadPool> MakePool(int threads) {
  if (threads <= 1) return nullptr;
  return std::make_unique<core::ThreadPool>(static_cast<size_t>(threads - 1));
}

namespace {

uint64_t StreamBase(uint64_t seed, uint64_t stream) {
  return SplitMix64(SplitMix64(seed) + stream);
}

float GaussianFromBase(uint64_t base, uint64_t j) {
  const uint64_t r = SplitMix64(base + j);
  const uint64_t s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
  return static_cast<float>(static_cast<int32_t>(s) - 131070) * kGaussianScale;
}

}  // namespace

float GaussianAt(uint64_t seed, uint64_t stream, uint64_t j) {
  return GaussianFromBase(StreamBase(seed, stream), j);
}

int NumOutliers(int n) { return std::max(1, n / 8); }

void FillInputs(uint64_t seed, std::span<float* const> rows, size_t d, core::ThreadPool* pool,
                int outliers) {
  const size_t n = rows.size();
  const size_t count = outliers < 0 ? static_cast<size_t>(NumOutliers(static_cast<int>(n)))
                                    : std::min(n, static_cast<size_t>(outliers));
  const size_t first_outlier = n - count;
  const size_t blocks = (d + kFillBlock - 1) / kFillBlock;
  // One task per block of coordinates: the common vector's block is made once and
  // shared by all rows.
  auto fill = [&](size_t block) {
    const size_t begin = block * kFillBlock;
    const size_t end = std::min(d, begin + kFillBlock);
    std::vector<float> common(end - begin);
    const uint64_t common_base = StreamBase(seed, 0);
    for (size_t j = begin; j < end; ++j) common[j - begin] = GaussianFromBase(common_base, j);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t base = StreamBase(seed, i + 1);
      float* row = rows[i];
      if (i >= first_outlier) {
        for (size_t j = begin; j < end; ++j) {
          row[j] = -4.0f * common[j - begin] + 8.0f * GaussianFromBase(base, j);
        }
      } else {
        for (size_t j = begin; j < end; ++j) {
          row[j] = common[j - begin] + 0.5f * GaussianFromBase(base, j);
        }
      }
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(blocks, fill);
  } else {
    for (size_t b = 0; b < blocks; ++b) fill(b);
  }
}

Table::Table(std::vector<std::string> header) : header_(std::move(header)) {}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(header_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::FILE* out) const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c > 0) line += "  ";
      line += c == 0 ? row[c] + pad : pad + row[c];
    }
    std::fprintf(out, "%s\n", std::string(absl::StripTrailingAsciiWhitespace(line)).c_str());
  };
  print_row(header_);
  std::vector<std::string> rule;
  for (size_t w : width) rule.emplace_back(w, '-');
  print_row(rule);
  for (const auto& row : rows_) print_row(row);
}

absl::Status WriteJsonArray(const std::string& path,
                            const std::vector<cli::JsonObjectWriter>& rows) {
  std::vector<std::string> texts;
  texts.reserve(rows.size());
  for (const cli::JsonObjectWriter& row : rows) texts.push_back(row.str());
  return WriteJsonArray(path, texts);
}

absl::Status WriteJsonArray(const std::string& path, const std::vector<std::string>& rows) {
  std::ofstream file(path, std::ios::trunc);
  if (!file) return absl::UnavailableError(absl::StrCat("cannot open '", path, "' for writing"));
  file << "[";
  for (size_t i = 0; i < rows.size(); ++i) file << (i > 0 ? ",\n " : "\n ") << rows[i];
  file << "\n]\n";
  file.close();
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

int FinishReport(std::string_view command, const Table& table, std::string_view skipped_heading,
                 const std::vector<std::string>& skipped, const std::string& json_path,
                 const std::vector<cli::JsonObjectWriter>& json_rows, int errors) {
  std::vector<std::string> texts;
  texts.reserve(json_rows.size());
  for (const cli::JsonObjectWriter& row : json_rows) texts.push_back(row.str());
  return FinishReport(command, table, skipped_heading, skipped, json_path, texts, errors);
}

int FinishReport(std::string_view command, const Table& table, std::string_view skipped_heading,
                 const std::vector<std::string>& skipped, const std::string& json_path,
                 const std::vector<std::string>& json_rows, int errors) {
  table.Print(stdout);
  if (!skipped.empty()) {
    std::printf("\n%.*s:\n", static_cast<int>(skipped_heading.size()), skipped_heading.data());
    for (const std::string& s : skipped) std::printf("  %s\n", s.c_str());
  }
  std::fflush(stdout);
  if (!json_path.empty()) {
    if (absl::Status st = WriteJsonArray(json_path, json_rows); !st.ok()) {
      std::fprintf(stderr, "ps-bench %.*s: %s\n", static_cast<int>(command.size()),
                   command.data(), std::string(st.message()).c_str());
      return 2;
    }
  }
  return errors > 0 ? 1 : 0;
}

std::string FormatG(double value, int digits) { return absl::StrFormat("%.*g", digits, value); }

absl::Status Errno(std::string_view what) {
  return absl::InternalError(absl::StrCat(core::AsAbsl(what), ": ", std::strerror(errno)));
}

void AddTcpRtoMinOption(CLI::App* sub, int* ms) {
  sub->add_option("--tcp-rto-min-ms", *ms,
                  "The shards' --tcp-rto-min-ms (the TCP plane's least retransmission "
                  "timeout, both ends; -1: auto, 10 where the kernel can set it; 0: the "
                  "kernel's)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 200));
}

}  // namespace ps::bench
