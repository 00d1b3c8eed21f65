// Writes (or checks) the seed corpus of the codec_decode fuzz target: for every spec of
// ExampleSpecs(), valid payloads of small Gaussian, edge-value, all-zero and empty
// inputs, and a few corrupted variants of one of them (docs/fuzzing.md).
//
//   codec_seeds --out DIR     writes the current seeds into DIR and removes stale ones
//   codec_seeds --check DIR   exit 1 (listing the differences) unless DIR holds exactly
//                             the current seeds; ctest fuzz_codec_seeds_current
//
// Only generated files (names starting with three digits and '_') are managed: other
// files in DIR (crash reproducers, inputs merged from a libFuzzer corpus, which are
// named by their SHA-1) are left alone and not checked.
//
// File layout (codec_decode_fuzz.cc): byte 0 = index of the spec in ExampleSpecs(),
// bytes 1-2 = element count (little-endian), then the payload. File names are
// "<index>_<spec with punctuation as _>_<input>". Everything is deterministic: a fixed
// generator, CodecOptions{seed = 1}, fixed EncodeContexts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "codecs/codec.h"
#include "tests/codecs/example_specs.h"

namespace {

namespace fs = std::filesystem;
using Corpus = std::map<std::string, std::string>;  // file name -> bytes

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Approximately N(0, 1): Irwin-Hall sum of four 16-bit uniforms, exact in float.
std::vector<float> Gaussian(size_t n, uint64_t stream) {
  std::vector<float> v(n);
  for (size_t j = 0; j < n; ++j) {
    const uint64_t r = SplitMix64(SplitMix64(stream) + j);
    const uint64_t s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
    v[j] = static_cast<float>(static_cast<int32_t>(s) - 131070) * (1.7320508f / 65536.0f);
  }
  return v;
}

std::string FileSafe(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-';
    if (ok) {
      out += c;
    } else if (out.empty() || out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

std::string Input(size_t index, size_t numel, std::string_view payload) {
  std::string in;
  in += static_cast<char>(index);
  in += static_cast<char>(numel & 0xFF);
  in += static_cast<char>((numel >> 8) & 0xFF);
  in += payload;
  return in;
}

struct Case {
  std::string name;
  std::vector<float> values;
  uint32_t matrix_cols;
};

// Encodes `values` with a fresh codec (state never carries between seeds); an empty
// string when the codec refuses them.
std::string Encode(const std::string& spec, const Case& c) {
  auto codec = ps::codecs::MakeCodec(spec, ps::codecs::CodecOptions{.seed = 1});
  if (!codec.ok()) {
    std::fprintf(stderr, "codec_seeds: %s: %s\n", spec.c_str(),
                 std::string(codec.status().message()).c_str());
    std::exit(2);
  }
  const ps::codecs::EncodeContext ctx{
      .round = 1, .slice_id = 2, .worker_id = 3, .matrix_cols = c.matrix_cols};
  std::string out;
  if (!(*codec)->Encode(c.values, ctx, &out).ok()) return {};
  return out;
}

Corpus MakeCorpus() {
  const std::vector<ps::codecs::testing::ExampleSpec>& specs = ps::codecs::testing::ExampleSpecs();
  if (specs.size() > 256) {
    std::fprintf(stderr, "codec_seeds: more than 256 example specs; byte 0 cannot index them\n");
    std::exit(2);
  }
  // Edge values, largest magnitudes first dropped when a codec cannot encode them.
  const std::vector<std::vector<float>> edges = {
      {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-8f, 1.0f, -1.0f, 1000.0f, -65504.0f, 65504.0f, 3e38f,
       -3e38f},
      {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-8f, 1.0f, -1.0f, 1000.0f, -65504.0f, 65504.0f, 0.5f,
       -0.25f},
      {0.0f, -0.0f, 1e-8f, 1.0f, -1.0f, 1000.0f, -1000.0f, 0.5f, -0.25f, 2.0f, 3.0f, -4.0f},
  };
  Corpus corpus;
  for (size_t index = 0; index < specs.size(); ++index) {
    const std::string& spec = specs[index].spec;
    const std::string prefix = absl::StrFormat("%03d_%s_", index, FileSafe(spec));
    std::vector<Case> cases = {
        {"gauss_5", Gaussian(5, 5), 0},
        {"gauss_300", Gaussian(300, 300), 20},  // a 15 x 20 matrix for PowerSGD
        {"zeros_64", std::vector<float>(64, 0.0f), 8},
        {"empty_0", {}, 0},
    };
    for (const Case& c : cases) {
      const std::string payload = Encode(spec, c);
      if (!payload.empty()) corpus[prefix + c.name] = Input(index, c.values.size(), payload);
    }
    for (const std::vector<float>& edge : edges) {
      const Case c{"edge_12", edge, 4};
      const std::string payload = Encode(spec, c);
      if (payload.empty()) continue;
      corpus[prefix + c.name] = Input(index, c.values.size(), payload);
      break;
    }
    // Corruptions of a valid payload, each of which a decoder must refuse.
    const std::string base = Encode(spec, cases[0]);
    if (base.empty()) continue;
    const size_t n = cases[0].values.size();
    // Another codec's format byte, then one no codec has.
    std::string other_format = base;
    other_format[0] = static_cast<char>(base[0] == 1 ? 2 : 1);
    std::string bad_version = base;
    bad_version[0] = static_cast<char>(0xee);
    std::string ones_tail = base;
    // The last (up to) four bytes after the version byte set to 0xff.
    for (size_t i = std::max<size_t>(1, base.size() - std::min<size_t>(base.size(), 4));
         i < base.size(); ++i) {
      ones_tail[i] = '\xff';
    }
    corpus[prefix + "bad_version"] = Input(index, n, bad_version);
    corpus[prefix + "other_format"] = Input(index, n, other_format);
    corpus[prefix + "truncated"] = Input(index, n, base.substr(0, base.size() - 1));
    corpus[prefix + "extra_byte"] = Input(index, n, base + std::string(1, '\0'));
    corpus[prefix + "numel_plus_1"] = Input(index, n + 1, base);
    if (ones_tail != base) corpus[prefix + "ones_tail"] = Input(index, n, ones_tail);
  }
  return corpus;
}

// Whether `name` is one of the files this tool writes ("001_fp16_gauss_5").
bool IsGenerated(std::string_view name) {
  return name.size() > 4 && name[0] >= '0' && name[0] <= '9' && name[1] >= '0' && name[1] <= '9' &&
         name[2] >= '0' && name[2] <= '9' && name[3] == '_';
}

bool ReadFile(const fs::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

int Write(const fs::path& dir, const Corpus& corpus) {
  fs::create_directories(dir);
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && IsGenerated(name) && !corpus.contains(name)) {
      fs::remove(entry.path());
      ++removed;
    }
  }
  for (const auto& [name, bytes] : corpus) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "codec_seeds: cannot write %s\n", (dir / name).c_str());
      return 2;
    }
  }
  std::printf("codec_seeds: wrote %zu files to %s (removed %d stale ones) for %zu specs\n",
              corpus.size(), dir.c_str(), removed, ps::codecs::testing::ExampleSpecs().size());
  return 0;
}

int Check(const fs::path& dir, const Corpus& corpus) {
  std::vector<std::string> problems;
  std::map<std::string, bool> present;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string name = entry.path().filename().string();
      if (!IsGenerated(name)) continue;
      const auto it = corpus.find(name);
      if (it == corpus.end()) {
        problems.push_back("not a current seed: " + name);
        continue;
      }
      std::string bytes;
      if (!ReadFile(entry.path(), &bytes) || bytes != it->second) {
        problems.push_back("different bytes: " + name);
      }
      present[name] = true;
    }
  }
  for (const auto& [name, bytes] : corpus) {
    if (!present.contains(name)) problems.push_back("missing: " + name);
  }
  if (problems.empty()) {
    std::printf("codec_seeds: %s holds the %zu current seeds\n", dir.c_str(), corpus.size());
    return 0;
  }
  std::sort(problems.begin(), problems.end());
  for (const std::string& p : problems) std::fprintf(stderr, "codec_seeds: %s\n", p.c_str());
  std::fprintf(stderr,
               "codec_seeds: %s is not the current seed corpus (ExampleSpecs() or an encoder "
               "changed); regenerate it with: <build>/fuzz/codec_seeds --out "
               "tests/fuzz/corpus/codec_decode\n",
               dir.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 ||
      (std::string_view(argv[1]) != "--out" && std::string_view(argv[1]) != "--check")) {
    std::fprintf(stderr, "usage: %s --out DIR | --check DIR\n", argv[0]);
    return 2;
  }
  const Corpus corpus = MakeCorpus();
  return std::string_view(argv[1]) == "--out" ? Write(argv[2], corpus) : Check(argv[2], corpus);
}
