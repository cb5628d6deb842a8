// fuzz_http: bytes as an HTTP client would send them. The first byte picks the chunk size the bytes are
// fed to Beast's request parser in (a socket delivers any split). A complete request's body goes through
// openai::map_request and ollama::map_request for every endpoint; whatever car's validation says of the
// mapped request (InferBuilder::finish), the response, chunk, usage and error builders must make JSON that
// parses, every SSE event must end with a blank line and every Ollama stream line with one newline. Nothing
// may throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "daemon/http/ollama.h"
#include "daemon/http/openai.h"
#include "daemon/protocol.h"

namespace {

namespace bhttp = boost::beast::http;
using nlohmann::json;
namespace openai = car::daemon::http::openai;
namespace ollama = car::daemon::http::ollama;

void require(bool ok) {
  if (!ok) std::abort();
}

void check_event(const std::string& event) {
  require(event.size() >= 8 && event.compare(0, 6, "data: ") == 0);
  require(event.compare(event.size() - 2, 2, "\n\n") == 0);
}

void map_body(openai::Endpoint endpoint, std::string_view body) {
  openai::Mapped m;
  auto err = openai::map_request(endpoint, body, m);
  if (err) {
    require(err->status == 400 && !err->message.empty());
    check_event(openai::sse_event(car::protocol::dump(openai::error_body(*err))));
    return;
  }
  auto infer = std::move(m.infer).finish();
  if (!infer.ok()) {
    auto e = openai::from_car_error(infer.error().code, infer.error().message);
    require(e.status == 400);
    return;
  }
  car::protocol::InferResult result;
  result.model = infer->model;
  result.output.text = infer->generate.prompt;
  result.output.finish_reason = "eos";
  result.output.prompt_tokens = 1;
  result.output.tokens = {1, 2};
  result.logprobs = infer->generate.logprobs;
  car::protocol::TokenLogprobs lp;
  lp.token = 1;
  lp.text = infer->generate.prompt;
  lp.logprob = -1.0;
  lp.top_logprobs = {{1, infer->generate.prompt, -1.0}};
  result.output.logprobs = {lp, lp};
  require(json::accept(openai::response(endpoint, m, result, "id", 0)));
  check_event(openai::sse_event(openai::text_chunk(endpoint, m, "id", 0, infer->generate.prompt, true, &lp)));
  check_event(openai::sse_event(openai::finish_chunk(endpoint, m, "id", 0, "length")));
  check_event(openai::sse_event(openai::usage_chunk(endpoint, m, "id", 0, result.output)));
}

void check_line(const std::string& line) {
  require(!line.empty() && line.back() == '\n' && line.find('\n') == line.size() - 1);
  require(json::accept(line));
}

void map_ollama(ollama::Endpoint endpoint, std::string_view body) {
  ollama::Mapped m;
  auto err = ollama::map_request(endpoint, body, m);
  if (err) {
    require(err->status == 400 && !err->message.empty());
    check_line(car::protocol::dump(ollama::error_body(*err)) + "\n");
    return;
  }
  require(!m.model.empty());
  require(!m.unload || m.load_only);
  if (m.load_only) {
    require(json::accept(ollama::load_object(endpoint, m.model, "t", m.unload)));
    return;
  }
  auto infer = std::move(m.infer).finish();
  if (!infer.ok()) return;
  car::protocol::InferResult result;
  result.model = infer->model;
  result.output.text = m.raw_prompt;
  result.output.finish_reason = "stop";
  result.output.tokens = {1};
  check_line(ollama::text_line(endpoint, m.model, "t", m.raw_prompt));
  check_line(ollama::final_object(endpoint, m.model, "t", result, "", true));
  require(json::accept(ollama::final_object(endpoint, m.model, "t", result, m.raw_prompt, false)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 1 + data[0] % 97;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);

  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(1u << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  std::string pending;
  for (std::size_t at = 0; at < bytes.size() && !parser.is_done(); at += chunk) {
    pending.append(bytes.substr(at, chunk));
    while (!pending.empty() && !parser.is_done()) {
      const std::size_t used = parser.put(boost::asio::buffer(pending), ec);
      if (ec == bhttp::error::need_more) {
        ec = {};
        pending.erase(0, used);
        break;
      }
      if (ec) return 0;  // malformed: the front answers 400 and closes
      pending.erase(0, used);
      if (used == 0) break;
    }
  }
  if (!parser.is_done()) return 0;
  const auto& req = parser.get();
  require(req.body().size() <= (1u << 20));
  map_body(openai::Endpoint::kChat, req.body());
  map_body(openai::Endpoint::kCompletions, req.body());
  map_ollama(ollama::Endpoint::kGenerate, req.body());
  map_ollama(ollama::Endpoint::kChat, req.body());
  return 0;
}
