// fuzz_protocol: bytes as a client would send them. The first byte picks the chunk size the bytes are fed
// to a LineFramer in (a socket delivers any split) and the framer's line limit; every framed line then goes
// through the daemon's request path: parse_request, model_field, parse_infer, and the reply builders with
// the recovered id; and through the client's parse_reply. Checks: lines never hold '\n' nor exceed the
// limit; the framed lines are the same whatever the chunking; validated infer fields are in range; every
// reply line is JSON that parses back to the same id. Nothing may throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/protocol.h"

namespace {

using car::protocol::LineFramer;
using nlohmann::json;

void require(bool ok) {
  if (!ok) std::abort();
}

std::vector<LineFramer::Item> frame(std::string_view bytes, std::size_t chunk, std::size_t max_line) {
  LineFramer framer(max_line);
  std::vector<LineFramer::Item> items;
  for (std::size_t at = 0; at < bytes.size(); at += chunk) framer.feed(bytes.substr(at, chunk), items);
  require(framer.buffered() <= max_line);
  return items;
}

void check_reply(const std::string& line, const json& id) {
  require(line.find('\n') == std::string::npos);
  json back = json::parse(line, nullptr, /*allow_exceptions=*/false);
  require(!back.is_discarded());
  require(back.contains("id"));
  // Invalid UTF-8 inside a string id is replaced on the wire, so compare only ids that survive it.
  if (!id.is_string()) require(back["id"] == id);
}

void one_line(const std::string& line) {
  json id;
  auto req = car::protocol::parse_request(line, &id);
  check_reply(car::protocol::error_line(id, car::protocol::code::kBadRequest, line.substr(0, 64)), id);
  if (req.ok()) {
    // Whether the compact form was read by hand or the line went through the full parser, the request is
    // what the JSON document says.
    json doc = json::parse(line, nullptr, /*allow_exceptions=*/false);
    require(!doc.is_discarded() && doc.is_object());
    require(doc.contains("op") && doc["op"] == req->op);
    const json doc_id = doc.contains("id") ? doc["id"] : json();
    require(doc_id.type() == req->id.type() && doc_id == req->id);
    check_reply(car::protocol::ok_line(req->id, req->body), req->id);
    auto model = car::protocol::model_field(req->body);
    if (model.ok()) require(req->body.contains("model"));
    auto infer = car::protocol::parse_infer(req->body);
    if (infer.ok()) {
      const auto& g = infer->generate;
      require(g.max_tokens >= 0 && g.max_tokens <= car::limits::kMaxGenerateTokens);
      require(g.sampling.temperature >= 0);
      require(g.sampling.top_k >= 0);
      require(g.sampling.top_p >= 0 && g.sampling.top_p <= 1);
      require(g.sampling.min_p >= 0 && g.sampling.min_p <= 1);
      require(g.sampling.repeat_penalty > 0);
      require(g.top_logprobs >= 0 && g.top_logprobs <= car::limits::kMaxTopLogprobs);
      require(g.top_logprobs == 0 || g.logprobs);
      (void)car::protocol::check_fields(car::protocol::Op::kInfer, req->body);
      for (const auto& s : g.stop) {
        check_reply(car::protocol::token_line(req->id, car::protocol::TokenEvent{1, s, std::nullopt}),
                    req->id);
      }
      check_reply(car::protocol::token_line(req->id, car::protocol::TokenEvent{-1, g.prompt, std::nullopt}),
                  req->id);
    }
  }
  (void)car::protocol::parse_reply(line);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 1 + data[0] % 61;
  // Mostly the real limit; sometimes a small one so the oversized path is reached with small inputs.
  const std::size_t max_line = (data[0] & 0x80) != 0 ? 16 + data[0] % 48 : car::protocol::kMaxLineBytes;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);

  auto items = frame(bytes, chunk, max_line);
  auto whole = frame(bytes, bytes.size() + 1, max_line);
  require(items.size() == whole.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    require(items[i].kind == whole[i].kind && items[i].line == whole[i].line);
    require(items[i].line.size() <= max_line);
    require(items[i].line.find('\n') == std::string::npos);
    if (items[i].kind == LineFramer::Item::Kind::kLine) one_line(items[i].line);
  }
  return 0;
}
