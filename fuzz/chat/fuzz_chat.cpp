// fuzz_chat: Template::parse + render on arbitrary bytes. The input is `flags byte, template[, '\0',
// context JSON]`; without a valid JSON object after a NUL the context is a fixed chat conversation (with
// tools, bos/eos, add_generation_prompt). Limits are small so runaway templates stop fast. Nothing may
// crash or trip a sanitizer; errors carry a known code and a message; success stays within the output
// bound; rendering is deterministic (a second render gives the same result).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/chat/jinja.h"

namespace {

using car::chat::Value;

const Value& default_context() {
  static const Value ctx = Value::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <b>there</b>\n"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": "{\"t\": 18}"},
      {"role": "assistant", "content": "<think>plan</think>It is 18."},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3, "f": 2.5
  })"));
  return ctx;
}

void check(const car::Result<std::string>& r, size_t max_output) {
  if (r.ok()) {
    if (r->size() > max_output) std::abort();
    return;
  }
  const std::string& code = r.error().code;
  if (code != "template_syntax" && code != "template_error" && code != "raise_exception") std::abort();
  if (code != "raise_exception" && r.error().message.empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  Value ctx = default_context();
  const size_t nul = input.find('\0');
  if (nul != std::string::npos) {
    auto j = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) ctx = Value::from_json(j);
    input.resize(nul);
  }
  car::chat::RenderOptions o;
  o.js_strip_quirk = (flags & 1) != 0;
  o.limits.max_steps = 200'000;
  o.limits.max_output_bytes = 1 << 20;
  o.limits.max_string_bytes = 1 << 20;
  o.limits.max_list_items = 1 << 16;
  o.limits.max_call_depth = 16;
  std::tm tm{};
  tm.tm_year = 126;
  tm.tm_mday = 15;
  o.now = tm;
  auto t = car::chat::Template::parse(input);
  if (!t.ok()) {
    check(car::Result<std::string>(t.error()), o.limits.max_output_bytes);
    return 0;
  }
  const auto a = t->render(ctx, o);
  check(a, o.limits.max_output_bytes);
  if ((flags & 2) != 0) {  // determinism, on a share of the inputs (it doubles the cost)
    const auto b = t->render(ctx, o);
    if (a.ok() != b.ok()) std::abort();
    if (a.ok() && *a != *b) std::abort();
    if (!a.ok() && (a.error().code != b.error().code || a.error().message != b.error().message)) std::abort();
  }
  return 0;
}
