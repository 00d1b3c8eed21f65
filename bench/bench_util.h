// Pieces shared by the ps-bench subcommands: the memory-read baseline, timing, list
// parsing, the seeded input generator, table printing and JSON rows (docs/bench.md).
//
// Thread safety: the free functions are thread-safe; Table is plain
// values, not synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/json_line.h"
#include "core/thread_pool.h"

namespace ps::bench {

// ---- Baseline -------------------------------------------------------------------

// Single-thread memory read bandwidth in GB/s (1e9 bytes per second): the best of
// `repeats` passes summing a `bytes`-byte buffer (written first, so its pages are real)
// with a vectorizable loop on the calling thread. The sum is kept, so the compiler
// cannot drop the loop.
double MeasureMemReadGBps(size_t bytes, int repeats);

// The baseline as every subcommand takes it: measured at the start (reported on
// stderr) and again at the end of the run; the higher of the two counts.
class MemreadBaseline {
 public:
  explicit MemreadBaseline(uint64_t bytes);
  // Measures the end; returns the baseline the ratios use.
  double Finish();
  // "memory read baseline, 1 thread, 2^30 bytes: 2.90 GB/s at start, ..." (after Finish).
  std::string Describe() const;

 private:
  uint64_t bytes_;
  double start_ = 0, end_ = 0;
};

// ---- Timing ---------------------------------------------------------------------

struct TimingOptions {
  // Timed repeats after one untimed warm-up call.
  int repeats = 3;
  // Each repeat makes enough calls to last at least this long (judged from the warm-up
  // call), and at least one; the repeat's figure is its time per call.
  double min_seconds = 0.1;
};

struct Timing {
  double best_seconds = 0;    // fastest repeat, seconds per call
  double median_seconds = 0;  // median repeat, seconds per call
  int calls_per_repeat = 0;
};

// Times `fn`. Returns the first error `fn` returns (the warm-up call finds most).
absl::StatusOr<Timing> TimeCalls(const std::function<absl::Status()>& fn,
                                 const TimingOptions& options);

double NowSeconds();
// User + system CPU seconds of every thread of this process so far (getrusage).
double ProcessCpuSeconds();

// ---- Flags ----------------------------------------------------------------------

// Splits "a,b(1,2),c" at commas outside parentheses; trims spaces, drops empty items.
std::vector<std::string> SplitList(std::string_view text);
// Parses a size: "1048576", "2^20", "1<<20", "1M" (K, M, G are powers of 1024).
absl::StatusOr<uint64_t> ParseSize(std::string_view text);
// Parses every item of every string in `texts` (each split by SplitList) as a size.
absl::StatusOr<std::vector<uint64_t>> ParseSizeList(const std::vector<std::string>& texts);
// Parses thread counts: numbers or "all" (std::thread::hardware_concurrency()).
absl::StatusOr<std::vector<int>> ParseThreadList(const std::vector<std::string>& texts);
// "2^20" for a power of two of at least 2^10, else the decimal number.
std::string FormatSize(uint64_t value);

// ThreadPool for `threads` workers in all, the calling thread included (ParallelFor
// runs tasks on the caller too): threads - 1 pool threads. Returns nullptr for 1.
std::unique_ptr<core::ThreadPool> MakePool(int threads);

// ---- Inputs ---------------------------------------------------------------------

// The seeded generator shared with bench/compare_torch.py, which reproduces it bit for
// bit: an approximately standard normal value (Irwin-Hall sum of four 16-bit uniforms
// from splitmix64) for coordinate j of stream s.
float GaussianAt(uint64_t seed, uint64_t stream, uint64_t j);
// How many of n inputs FillInputs makes outliers (the last ones): max(1, n / 8).
int NumOutliers(int n);
// Fills rows[i][0..d) for the n = rows.size() inputs: a common vector c (stream 0);
// honest input i is c + 0.5 g_i, an outlier is -4 c + 8 g_i (g_i: stream i + 1); the
// last `outliers` inputs are outliers (-1: NumOutliers(n); more than n: all). Runs on `pool`
// when given; the values do not depend on it.
void FillInputs(uint64_t seed, std::span<float* const> rows, size_t d, core::ThreadPool* pool,
                int outliers = -1);

// ---- Output ---------------------------------------------------------------------

// A text table: first column left-aligned, the others right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void AddRow(std::vector<std::string> cells);
  void Print(std::FILE* out) const;
  bool empty() const { return rows_.empty(); }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Writes `rows` as a JSON array, one object per line.
absl::Status WriteJsonArray(const std::string& path,
                            const std::vector<cli::JsonObjectWriter>& rows);
// The same with each row's text as given (a JSON object the writer cannot make, with
// nested objects or arrays).
absl::Status WriteJsonArray(const std::string& path, const std::vector<std::string>& rows);

// The end of every subcommand: prints the table and, when any, `skipped` under
// `skipped_heading`; writes `json_rows` to `json_path` when it is not empty. Returns
// the exit status: 2 when the JSON file cannot be written (reported on stderr with
// `command`), 1 when `errors` > 0, else 0.
int FinishReport(std::string_view command, const Table& table, std::string_view skipped_heading,
                 const std::vector<std::string>& skipped, const std::string& json_path,
                 const std::vector<cli::JsonObjectWriter>& json_rows, int errors);
// The same with each JSON row's text as given.
int FinishReport(std::string_view command, const Table& table, std::string_view skipped_heading,
                 const std::vector<std::string>& skipped, const std::string& json_path,
                 const std::vector<std::string>& json_rows, int errors);

// Formats like printf's %.*g.
std::string FormatG(double value, int digits);

// ---- Errors ---------------------------------------------------------------------

// INTERNAL "`what`: strerror(errno)", for a system call that failed.
absl::Status Errno(std::string_view what);

}  // namespace ps::bench
