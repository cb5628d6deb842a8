// fuzz_chat: Template::parse + render on arbitrary bytes. The input is `flags byte, template[, '\0',
// context JSON]`; without a valid JSON object after a NUL the context is a fixed chat conversation (with
// tools, bos/eos, add_generation_prompt). Limits are small so runaway templates stop fast. Nothing may
// crash or trip a sanitizer; errors carry a known code and a message; success stays within the output
// bound; rendering is deterministic (a second render gives the same result).
//
// Issue #23: a custom mutator (one mutation in eight) grows what the byte-level mutations practically never
// build: an operator, attribute, subscript, call, filter or test chain hundreds to tens of thousands of
// links long, and a context JSON nested as deep. A context deeper than Value::from_json takes is
// checked to be refused (and the conversation then rendered through render_chat, which must say
// bad_messages). scripts/fuzz.sh runs this under a small stack, so an unbounded recursion crashes here.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/chat/chat.h"
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
  nlohmann::ordered_json deep;  // a context too deep for the template values
  if (nul != std::string::npos) {
    auto j = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      if (car::chat::json_depth(j) <= car::chat::kMaxJsonDepth) {
        ctx = Value::from_json(j);
      } else {
        bool refused = false;
        try {
          (void)Value::from_json(j);
        } catch (const std::invalid_argument&) {
          refused = true;
        }
        if (!refused) std::abort();
        deep = std::move(j);
      }
    }
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
  if (!deep.is_null()) {
    // The chat API on it: a conversation too deep is bad_messages, whatever the template.
    // Moved, never copied: copying a document recurses.
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (auto it = deep.find("messages"); it != deep.end()) {
      messages = std::move(*it);
    } else {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      m["role"] = "user";
      m["content"] = std::move(deep);
      messages.push_back(std::move(m));
    }
    car::chat::ChatOptions co;
    co.render = o;
    const auto r = car::chat::render_chat(input, messages, co);
    if (r.ok() ? r->size() > o.limits.max_output_bytes : r.error().message.empty()) std::abort();
    if (!r.ok() && r.error().code != "bad_messages" && r.error().code != "template_syntax" &&
        r.error().code != "template_error" && r.error().code != "raise_exception") {
      std::abort();
    }
    return 0;
  }
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

namespace {

// Links of the chains the parser builds as left-leaning trees (each one level deeper).
constexpr const char* kLinks[] = {"+1",          ".a",           "|e",         "[0]",     "()",
                                  " is defined", " ~ 'a'",       " and x",     " or 0",   " * 1",
                                  " ** 1",       "|default(1)",  "[0:1]",      " if 1",   " - 1",
                                  "|list",       " is not none", "|join(',')", "|string", "|length"};

size_t pick_count(std::minstd_rand& rng) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 64;  // short: what real templates write
    case 1:
      return 240 + rng() % 32;  // around the tree depth limit (256)
    case 2:
      return 256 + rng() % 4000;  // past it, far enough to overflow a 1 MiB stack without the limit
    default:
      return rng() % 8 == 0 ? 4256 + rng() % 36000 : 256 + rng() % 4000;  // now and then, the issue's sizes
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 8 != 0 || max_size < 32) return LLVMFuzzerMutate(data, size, max_size);
  std::string in(reinterpret_cast<const char*>(data), size);
  if (in.empty()) in.push_back('\0');
  const size_t nul = in.find('\0', 1);
  std::string tpl = in.substr(1, nul == std::string::npos ? std::string::npos : nul - 1);
  std::string ctx = nul == std::string::npos ? "" : in.substr(nul + 1);
  const size_t room = max_size - 1;
  if (rng() % 4 == 0) {
    // A context nested deep: arrays or objects, in a message's content or at the top.
    const size_t depth = std::min(pick_count(rng), room / 8);
    std::string open, close;
    const bool objects = rng() % 2 != 0;
    for (size_t i = 0; i < depth; ++i) {
      open += objects ? "{\"a\":" : "[";
      close += objects ? "}" : "]";
    }
    const std::string value = open + "1" + close;
    ctx = rng() % 2 != 0 ? R"({"messages":[{"role":"user","content":)" + value + "}]}"
                         : R"({"x":)" + value + "}";
  } else {
    // A chain grown inside an output tag (before a random "}}", or in a new one at the end).
    const std::string link = kLinks[rng() % (sizeof kLinks / sizeof kLinks[0])];
    const size_t budget = room > tpl.size() + ctx.size() + 16 ? room - tpl.size() - ctx.size() - 16 : 0;
    const size_t n = std::min(pick_count(rng), budget / link.size());
    std::string chain;
    chain.reserve(n * link.size());
    for (size_t i = 0; i < n; ++i) chain += link;
    std::vector<size_t> closes;
    for (size_t at = tpl.find("}}"); at != std::string::npos; at = tpl.find("}}", at + 2))
      closes.push_back(at);
    if (!closes.empty() && rng() % 2 != 0) {
      tpl.insert(closes[rng() % closes.size()], chain);
    } else {
      tpl += "{{ x" + chain + " }}";
    }
  }
  std::string out(1, in[0]);
  out += tpl;
  if (!ctx.empty()) out += std::string(1, '\0') + ctx;
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
