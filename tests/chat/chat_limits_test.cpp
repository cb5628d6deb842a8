// A template and a conversation are request input: whatever they hold, rendering ends in a result or a
// clear error, never a crash (issue #23). Each case here killed the process by stack overflow before the
// tree depth bound, the stack check, the JSON depth bound and the iterative freeing of values; the
// cancellation cases held a thread until the step limit (17-18 s).
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/chat/chat.h"
#include "core/chat/jinja.h"

namespace {

using car::chat::RenderOptions;
using car::chat::Value;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// "ERROR[code] message" or the output.
std::string render_json(const std::string& src, const json& ctx = json::object(), const RenderOptions& o = {}) {
  auto r = car::chat::render_template(src, Value::from_json(ctx), o);
  if (!r.ok()) return "ERROR[" + r.error().code + "] " + r.error().message;
  return *r;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// The exact repros of the issue and their relatives: each is refused at parse time with template_syntax.
TEST(ChatLimits, LongChainsAreRefusedNotRecursedInto) {
  const json ctx = {{"x", {{"a", 1}}}, {"xs", json::array({1})}};
  const std::string cases[] = {
      "{{ 1" + repeat("+1", 9999) + " }}",              // 10,000 terms (20 KB)
      "{{ x" + repeat(".a", 30000) + " }}",             // attribute chain
      "{{ x" + repeat("|e", 60000) + " }}",             // filter chain
      "{{ x" + repeat("|default(1)", 5000) + " }}",     // filter chain with arguments
      "{{ 'a'" + repeat(" ~ 'a'", 10000) + " }}",       // concatenation
      "{{ 2" + repeat(" ** 1", 10000) + " }}",          // power
      "{{ 1" + repeat(" * 1", 10000) + " }}",           // multiplication
      "{{ true" + repeat(" and true", 10000) + " }}",   // and
      "{{ false" + repeat(" or false", 10000) + " }}",  // or
      "{{ xs" + repeat("[0]", 30000) + " }}",           // subscripts
      "{{ xs" + repeat("[0:1]", 30000) + " }}",         // slices
      "{{ range" + repeat("()", 30000) + " }}",         // calls
      "{{ x" + repeat(" is defined", 30000) + " }}",    // tests
      "{{ 1" + repeat(" if 1", 30000) + " }}",          // conditional without else
      "{% set y = x" + repeat(".a", 30000) + " %}",     // in a statement
      "{% for i in xs" + repeat("|list", 30000) + " %}{% endfor %}",
      "{% filter upper" + repeat("|lower", 30000) + " %}a{% endfilter %}",
  };
  for (const std::string& src : cases) {
    const std::string out = render_json(src, ctx);
    EXPECT_EQ(out.rfind("ERROR[template_syntax]", 0), 0u) << src.substr(0, 40) << ": " << out.substr(0, 200);
    EXPECT_NE(out.find("nests deeper than"), std::string::npos) << out.substr(0, 200);
  }
}

// Chained comparisons are one node (Python style), so a long chain is no deeper than a short one.
TEST(ChatLimits, FlatChainsStillRender) {
  std::string src = "{{ 0";
  for (int i = 1; i < 10000; ++i) src += " < " + std::to_string(i);
  EXPECT_EQ(render_json(src + " }}"), "True");
  // What real templates write is far inside the limits.
  EXPECT_EQ(render_json("{{ 1" + repeat("+1", 99) + " }}"), "100");
  EXPECT_EQ(render_json("{{ x" + repeat(".a", 1) + repeat("|string", 100) + " }}", {{"x", {{"a", 7}}}}), "7");
}

// A conversation nested deeper than the conversion into template values allows is bad_messages, before
// anything recurses over it. 30,000 levels in `content` crashed the daemon.
// (The deep documents are parsed and moved, never copied: nlohmann's copy recurses.)
json nested(int depth) {
  return json::parse(std::string(static_cast<size_t>(depth), '[') +
                     std::string(static_cast<size_t>(depth), ']'));
}
json user_message_with(json content) {
  json m = json::object();
  m["role"] = "user";
  m["content"] = std::move(content);
  json messages = json::array();
  messages.push_back(std::move(m));
  return messages;
}

TEST(ChatLimits, DeepMessageIsBadMessages) {
  const json messages = user_message_with(nested(30000));
  car::chat::ChatOptions co;
  auto r = car::chat::render_chat("{{ messages[0].content }}", messages, co);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "bad_messages");
  EXPECT_NE(r.error().message.find("nest deeper than 128"), std::string::npos) << r.error().message;
  // tools too
  co.tools = nested(30000);
  r = car::chat::render_chat("x", json::array({{{"role", "user"}}}), co);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "bad_messages");
  // Just inside the limit works: the array is one level, the message object another.
  r = car::chat::render_chat("{{ messages[0].content|length }}", user_message_with(nested(126)),
                             car::chat::ChatOptions{});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "1");
  EXPECT_THROW(Value::from_json(nested(30000)), std::invalid_argument);
  EXPECT_EQ(car::chat::json_depth(json::parse("[[1],{\"a\":[2]}]")), 3);
}

// Runs `fn` on a thread with a 1 MiB stack (a daemon worker has 8 MiB): the freeing below recursed about
// 64 bytes per level, which an 8 MiB stack survived up to ~100,000 levels but 1 MiB not past ~15,000.
void on_small_stack(const std::function<void()>& fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 1u << 20), 0);
  pthread_t t;
  auto run = [](void* f) -> void* {
    (*static_cast<const std::function<void()>*>(f))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&t, &attr, run, const_cast<std::function<void()>*>(&fn)), 0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
}

// Values a template nests itself, in a loop: freeing them (when replaced mid-render, or at the end) and
// printing them must not recurse without bound.
TEST(ChatLimits, DeepValuesBuiltByATemplate) {
  auto wrap_of = [](int depth) {
    return "{% set ns = namespace(x=[]) %}{% for i in range(" + std::to_string(depth) +
           ") %}{% set ns.x = [ns.x] %}{% endfor %}";
  };
  std::string results[4];
  on_small_stack([&] {
    results[0] = render_json(wrap_of(30000) + "{% set ns.x = 0 %}done");  // the old value freed mid-render
    results[1] = render_json(wrap_of(30000) + "{{ ns.x|length }}");       // freed when the render ends
    // The same with dicts, and with the outermost made first.
    results[2] = render_json(
        "{% set ns = namespace(x={}) %}{% for i in range(30000) %}{% set ns.x = {'k': ns.x} %}"
        "{% endfor %}{{ ns.x|length }}");
    results[3] = render_json(
        "{% set root = [] %}{% set ns = namespace(c=root) %}{% for i in range(30000) %}"
        "{% set n = [] %}{% if ns.c.append(n) %}{% endif %}{% set ns.c = n %}{% endfor %}"
        "{{ root|length }}");
  });
  EXPECT_EQ(results[0], "done");
  EXPECT_EQ(results[1], "1");
  EXPECT_EQ(results[2], "1");
  EXPECT_EQ(results[3], "1");
  // Printing stops at its depth bounds (past a few hundred levels is enough to reach them).
  const std::string wrap = wrap_of(1000);
  EXPECT_NE(render_json(wrap + "{{ ns.x }}").find("..."), std::string::npos);  // repr stops at 200 levels
  EXPECT_EQ(render_json(wrap + "{{ ns.x|tojson }}").rfind("ERROR[template_error]", 0), 0u);
  EXPECT_EQ(render_json(wrap + "{{ ns.x == ns.x }}").substr(0, 5), "False");  // equal stops at its depth bound
  // A list holding itself: printing stops, freeing breaks the cycle.
  EXPECT_NE(render_json("{% set l = [] %}{% if l.append(l) %}{% endif %}{{ l }}").find("..."), std::string::npos);
}

// The stack check behind the depth limits: recursion through macros, each level within every limit, still
// stops cleanly when the stack budget is spent.
TEST(ChatLimits, StackBudgetStopsDeepRecursion) {
  auto src_of = [](int calls) {
    return "{% macro m(n) %}{{ 1" + repeat("+1", 200) +
           " }}{% if n > 0 %}{{ m(n - 1) }}{% endif %}{% endmacro %}"
           "{{ m(" +
           std::to_string(calls) + ") }}";
  };
  const std::string src = src_of(60);
  RenderOptions o;
  o.limits.max_stack_bytes = 64u << 10;
  const std::string out = render_json(src, json::object(), o);
  EXPECT_EQ(out.rfind("ERROR[template_error]", 0), 0u) << out.substr(0, 200);
  EXPECT_NE(out.find("too deeply for the stack"), std::string::npos) << out.substr(0, 200);
  // With the default budget (2 MiB) a shallower recursion renders, even with a sanitizer's frames.
  EXPECT_EQ(render_json(src_of(10)).substr(0, 3), "201");
}

const std::string kNestedLoops =
    "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}"
    "{% endfor %}";

// Cancellation is seen inside the render: set from another thread, the render stops within ~1024 steps.
TEST(ChatLimits, CancelStopsARenderPromptly) {
  std::atomic<bool> cancelled{false};
  RenderOptions o;
  o.cancelled = &cancelled;
  o.limits.max_steps = UINT64_MAX;  // only the flag (or the deadline, far away) can stop it
  o.limits.max_duration = std::chrono::minutes(10);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancelled.store(true);
  });
  const auto start = Clock::now();
  auto r = car::chat::render_template(kNestedLoops, Value::dict(), o);
  const auto took = Clock::now() - start;
  setter.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "cancelled");
  EXPECT_LT(took, std::chrono::seconds(3));  // without the check: the whole loop, far longer
}

// The render's own deadline (RenderLimits::max_duration).
TEST(ChatLimits, DeadlineStopsARender) {
  RenderOptions o;
  o.limits.max_steps = UINT64_MAX;
  o.limits.max_duration = std::chrono::milliseconds(100);
  const auto start = Clock::now();
  const std::string out = render_json(kNestedLoops, json::object(), o);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(out.rfind("ERROR[template_error]", 0), 0u) << out;
  EXPECT_NE(out.find("ran longer than 100 ms"), std::string::npos) << out;
}

}  // namespace
