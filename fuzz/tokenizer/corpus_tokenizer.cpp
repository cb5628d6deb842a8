// corpus_tokenizer OUT_DIR [CONFORMANCE_DIR]: writes fuzz_tokenizer's seeds. Each seed is one selector byte
// (tokenizer and flags, see fuzz_tokenizer.cpp) followed by text: a few built-in strings (contractions,
// digits, whitespace runs, special-token text, emoji, CJK, invalid UTF-8) and, when the conformance folder is
// given, every llama.cpp tokenizer test string, each under several selectors.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: corpus_tokenizer OUT_DIR [CONFORMANCE_DIR]\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out);
  std::vector<std::string> texts = {"Hello world",
                                    " Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
                                    "   \n\n\t  x  ",
                                    "3333 33333 1234567",
                                    "<s>hi</s><|im_end|><tool>",
                                    "I'M here'll've",
                                    "\xC3\x28\xA0\xA1\xE2\x82\xF0\x9F\x98",
                                    "\xED\xA0\x80\xC0\x80\xF8\x88\x80\x80\x80",
                                    "H\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xD0\xBF\xD1\x80\xD0\xB8",
                                    "a . b , c 's d 't 're"};
  if (argc > 2) {
    const std::string sep = "\n__ggml_vocab_test__\n";
    for (const char* name : {"llama-bpe", "bert-bge", "deepseek-llm"}) {
      const auto p =
          std::filesystem::path(argv[2]) / "tokenizer" / (std::string("ggml-vocab-") + name + ".gguf.inp");
      std::ifstream in(p, std::ios::binary);
      if (!in) continue;
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string all = ss.str();
      for (size_t pos = 0;;) {
        const size_t end = all.find(sep, pos);
        if (end == std::string::npos) break;
        texts.push_back(all.substr(pos, end - pos));
        pos = end + sep.size();
      }
    }
  }
  int n = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // Selector bits 0-1: add_special, parse_special; bits 2-7: the tokenizer (taken modulo their number).
    for (unsigned k = 0; k < 16; ++k) {
      const unsigned sel = (k << 2) | static_cast<unsigned>(i % 4);
      std::ofstream f(out / ("seed-" + std::to_string(i) + "-" + std::to_string(sel)), std::ios::binary);
      f.put(static_cast<char>(sel));
      f << texts[i];
      ++n;
    }
  }
  std::printf("corpus_tokenizer: %d seeds\n", n);
  return 0;
}
