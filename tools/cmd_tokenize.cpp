// `car tokenize FILE.gguf TEXT [--json] [--no-bos] [--parse-special]`: the model's tokenization of TEXT.
//
// Tokenizes as the engine does for a prompt: BOS/EOS added as the vocabulary asks unless --no-bos,
// special-token text left as plain text unless --parse-special (CONTRACT.md). TEXT "-" reads standard input,
// whole, before the model is opened (a closed descriptor 0 must not become the model file's); a closed
// standard input, a directory or a read error fails the command.
// Human output is one token per line (`id<TAB>piece`, the piece escaped by terminal_text: \\ \n \t \r, \xNN
// for other controls and for bytes that are not UTF-8 (a byte-level piece may be half a character), \u0085
// style for C1 controls, so no piece can drive the terminal); --json prints {"ids": [...],
// "pieces": [...]} with pieces as llama_token_to_piece(special = true) gives them (bytes that are not valid
// UTF-8 become U+FFFD).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/gguf/gguf_file.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"
#include "tools/command_registry.h"
#include "tools/stdin_text.h"
#include "tools/terminal_text.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_tokenize {
namespace {

struct TokenizeOptions {
  std::string file;
  std::string text;
  bool json = false;
  bool no_bos = false;
  bool parse_special = false;
};

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "car tokenize: %s\n", msg.c_str());
  throw CommandFailed(1);
}

void run_tokenize(const TokenizeOptions& o) {
  // Before opening the model: with descriptor 0 closed, the model file would be opened as descriptor 0.
  std::string text = o.text;
  if (o.text == "-") {
    auto in = read_stdin_text();
    if (!in) fail(in.error().message);
    text = std::move(*in);
  }
  auto file = gguf::GgufFile::open(o.file);
  if (!file) fail(o.file + ": " + file.error().message);
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok) fail(o.file + ": " + tok.error().message);
  const auto ids = (*tok)->encode(text, !o.no_bos, o.parse_special);
  if (o.json) {
    nlohmann::json j;
    j["ids"] = ids;
    j["pieces"] = nlohmann::json::array();
    for (int32_t id : ids) j["pieces"].push_back(tokenizer::sanitize_utf8((*tok)->token_to_piece(id, true)));
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  for (int32_t id : ids)
    std::printf("%d\t%s\n", id, terminal_text((*tok)->token_to_piece(id, true), false).c_str());
}

void setup(CLI::App& root) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd =
      root.add_subcommand("tokenize", "Print the token ids (and pieces) of TEXT for a model's vocabulary");
  cmd->add_option("file", o->file, "GGUF file (a model or a vocab-only file)")->required();
  cmd->add_option("text", o->text, "Text to tokenize ('-' reads standard input)")->required();
  cmd->add_flag("--json", o->json, "One JSON object: {\"ids\": [...], \"pieces\": [...]}");
  cmd->add_flag("--no-bos", o->no_bos, "Add no special tokens (BOS/EOS)");
  cmd->add_flag("--parse-special", o->parse_special, "Let special-token text in TEXT become special tokens");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup);

}  // namespace car::tools::cmd_tokenize
