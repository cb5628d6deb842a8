// bench_tokenizer: Tokenizer::encode throughput (bytes_per_second of input text) on a 1 MiB text, and the
// time to build a Tokenizer from an already-opened GGUF file, for each llama.cpp test vocabulary in the
// conformance folder ($CAR_CONFORMANCE_DIR, else ../shared/conformance beside the checkout).
//
//   bench_tokenizer                                   # every vocabulary
//   bench_tokenizer --benchmark_filter='Encode/llama' # one family
//
// The text is the vocabulary's own llama.cpp test strings (English, code, whitespace runs, digits, emoji,
// CJK, Cyrillic, Khmer) concatenated with newlines and repeated to 1 MiB; a second text is 1 MiB of plain
// English-like prose (a fixed paragraph repeated). Encoding is add_special = false, parse_special = false,
// one call for the whole text, single-threaded.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using car::tokenizer::Tokenizer;

constexpr size_t kTextBytes = 1 << 20;

fs::path conformance_dir() {
  if (const char* env = std::getenv("CAR_CONFORMANCE_DIR"); env != nullptr && *env != '\0') return env;
  return CAR_DEFAULT_CONFORMANCE_DIR;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string repeat_to_size(const std::string& unit) {
  std::string text;
  text.reserve(kTextBytes + unit.size());
  while (text.size() < kTextBytes) text += unit;
  text.resize(kTextBytes);
  // Do not end inside a UTF-8 character.
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  return text;
}

std::string mixed_text(const fs::path& inp) {
  std::string unit = read_all(inp);
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos; (pos = unit.find(sep)) != std::string::npos;) unit.replace(pos, sep.size(), "\n");
  return repeat_to_size(unit);
}

const std::string& prose_text() {
  static const std::string text = repeat_to_size(
      "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, there "
      "lived an old fisherman who told stories to anyone who would listen. \"It's not the size of the "
      "boat,\" "
      "he'd say, \"but the patience of the sailor.\" The children laughed, and they'd come back every "
      "evening, 7 days a week, for 12 years.\n");
  return text;
}

struct Loaded {
  std::shared_ptr<const car::gguf::GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::string mixed;
};

void register_vocab(const std::string& name) {
  const fs::path base = conformance_dir() / "tokenizer" / ("ggml-vocab-" + name + ".gguf");
  auto file = car::gguf::GgufFile::open(base.string());
  if (!file) return;
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok) return;
  auto l = std::make_shared<Loaded>(Loaded{*file, *tok, mixed_text(base.string() + ".inp")});

  benchmark::RegisterBenchmark(
      ("Encode/" + name + "/mixed").c_str(),
      [l](benchmark::State& state) {
        size_t n = 0;
        for (auto _ : state) {
          auto ids = l->tok->encode(l->mixed, false, false);
          n = ids.size();
          benchmark::DoNotOptimize(ids.data());
        }
        state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * l->mixed.size()));
        state.counters["tokens"] = static_cast<double>(n);
      })
      ->Unit(benchmark::kMillisecond)
      ->MinTime(1.0);

  benchmark::RegisterBenchmark(
      ("Encode/" + name + "/prose").c_str(),
      [l](benchmark::State& state) {
        const std::string& text = prose_text();
        size_t n = 0;
        for (auto _ : state) {
          auto ids = l->tok->encode(text, false, false);
          n = ids.size();
          benchmark::DoNotOptimize(ids.data());
        }
        state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
        state.counters["tokens"] = static_cast<double>(n);
      })
      ->Unit(benchmark::kMillisecond)
      ->MinTime(1.0);

  benchmark::RegisterBenchmark(("Load/" + name).c_str(), [l](benchmark::State& state) {
    for (auto _ : state) {
      auto t = Tokenizer::from_gguf(*l->file);
      benchmark::DoNotOptimize(t.ok());
    }
    state.counters["n_vocab"] = l->tok->n_vocab();
  })->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm",
                           "deepseek-coder", "falcon", "mpt", "starcoder", "refact", "bert-bge"}) {
    register_vocab(name);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
