// Replay driver for fuzz targets in the normal (non-clang) build: runs
// LLVMFuzzerTestOneInput over every file of the given corpus directories, then over
// deterministic pseudo-random inputs and mutations of the corpus files. It finds
// nothing new the way libFuzzer does, but it keeps every target building and runs
// the seeds plus a few thousand cheap variations in CI, under sanitizers when the
// build has them (docs/fuzzing.md).
//
// Usage: <target> [--iterations=N] [--seed=S] CORPUS_DIR_OR_FILE...
// Exit status 0 when every input ran; a failing input aborts the process.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

// SplitMix64: small, fast, and the same sequence on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); n > 0.
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;
};

bool ReadFile(const std::filesystem::path& path, Bytes* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// The copy of `in` runs with its exact size, so ASan catches reads past the end.
void Run(const Bytes& in) {
  Bytes copy(in);
  LLVMFuzzerTestOneInput(copy.data(), copy.size());
}

uint8_t InterestingByte(Rng& rng) {
  static constexpr uint8_t kBytes[] = {0x00, 0x01, 0x02, 0x7f, 0x80, 0xff, 0x7c, 0xfc, 0x7e, 0x3c};
  return kBytes[rng.Below(std::size(kBytes))];
}

// One to four libFuzzer-style mutations: bit flips, byte writes, inserts, erases,
// truncation, chunk duplication, splicing with another corpus input.
Bytes Mutate(const Bytes& base, const std::vector<Bytes>& corpus, Rng& rng) {
  Bytes b = base;
  const int count = 1 + static_cast<int>(rng.Below(4));
  for (int m = 0; m < count; ++m) {
    switch (rng.Below(8)) {
      case 0:
        if (!b.empty()) b[rng.Below(b.size())] ^= static_cast<uint8_t>(1u << rng.Below(8));
        break;
      case 1:
        if (!b.empty()) b[rng.Below(b.size())] = static_cast<uint8_t>(rng.Next());
        break;
      case 2:
        if (!b.empty()) b[rng.Below(b.size())] = InterestingByte(rng);
        break;
      case 3:
        b.insert(b.begin() + static_cast<ptrdiff_t>(rng.Below(b.size() + 1)),
                 static_cast<uint8_t>(rng.Next()));
        break;
      case 4:
        if (!b.empty()) b.erase(b.begin() + static_cast<ptrdiff_t>(rng.Below(b.size())));
        break;
      case 5:
        b.resize(rng.Below(b.size() + 1));
        break;
      case 6:
        if (!b.empty()) {
          const size_t from = rng.Below(b.size());
          const size_t len = 1 + rng.Below(std::min<size_t>(b.size() - from, 64));
          const Bytes chunk(b.begin() + static_cast<ptrdiff_t>(from),
                            b.begin() + static_cast<ptrdiff_t>(from + len));
          b.insert(b.begin() + static_cast<ptrdiff_t>(rng.Below(b.size() + 1)), chunk.begin(),
                   chunk.end());
        }
        break;
      default: {
        const Bytes& other = corpus[rng.Below(corpus.size())];
        b.resize(rng.Below(b.size() + 1));
        b.insert(b.end(), other.begin() + static_cast<ptrdiff_t>(rng.Below(other.size() + 1)),
                 other.end());
        break;
      }
    }
  }
  return b;
}

Bytes RandomInput(Rng& rng) {
  // Mostly short inputs, sometimes up to 4 KiB.
  const size_t len = rng.Below(8) == 0 ? rng.Below(4097) : rng.Below(65);
  Bytes b(len);
  for (uint8_t& c : b) c = static_cast<uint8_t>(rng.Next());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 10000;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.rfind("--iterations=", 0) == 0) {
      iterations = std::strtol(argv[i] + 13, nullptr, 10);
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (std::filesystem::is_regular_file(arg)) {
      files.emplace_back(arg);
    } else {
      std::fprintf(stderr, "fuzz replay: no such corpus file or directory: %s\n", argv[i]);
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--iterations=N] [--seed=S] CORPUS_DIR_OR_FILE...\n"
                 "fuzz replay: no corpus files given\n",
                 argv[0]);
    return 2;
  }
  std::sort(files.begin(), files.end());  // directory order is not stable

  std::vector<Bytes> corpus;
  for (const auto& path : files) {
    Bytes b;
    if (!ReadFile(path, &b)) {
      std::fprintf(stderr, "fuzz replay: cannot read %s\n", path.c_str());
      return 2;
    }
    Run(b);
    corpus.push_back(std::move(b));
  }

  Rng rng(seed);
  Run(Bytes{});
  long mutated = 0;
  long random = 0;
  for (long i = 0; i < iterations; ++i) {
    if (i % 4 == 0) {
      Run(RandomInput(rng));
      ++random;
    } else {
      Run(Mutate(corpus[rng.Below(corpus.size())], corpus, rng));
      ++mutated;
    }
  }
  std::printf(
      "fuzz replay: %zu corpus files, %ld mutations, %ld random inputs, 1 empty input: "
      "%ld inputs ran, no failure\n",
      corpus.size(), mutated, random, static_cast<long>(corpus.size()) + mutated + random + 1);
  return 0;
}
