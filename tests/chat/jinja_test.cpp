// The interpreter on templates written here (runs without the shared conformance folder).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/chat/chat.h"
#include "core/chat/jinja.h"

namespace {

using car::chat::RenderOptions;
using car::chat::Value;
using json = nlohmann::ordered_json;

std::string render(const std::string& src, const std::string& ctx = "{}", RenderOptions o = {}) {
  auto r = car::chat::render_template(src, Value::from_json(json::parse(ctx)), o);
  if (!r.ok()) return "ERROR[" + r.error().code + "] " + r.error().message;
  return *r;
}

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(render("a{{ 1 + 2 * 3 }}b"), "a7b");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }}"), "3 -4 2 1024 3.5");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}"), "a1None");
  EXPECT_EQ(render("{{ x }}|{{ y }}|{{ z }}", R"({"x": true, "y": null, "z": [1, "a"]})"),
            "True|None|[1, 'a']");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"), "True False");
  EXPECT_EQ(render("{{ 'x' if 0 }}|{{ [1,2,3][1:] }}|{{ 'héllo'[1] }}"), "|[2, 3]|é");
}

TEST(Jinja, Loops) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.length }}{% endfor %}",
                   R"({"xs": ["a", "b"]})"),
            "112202");
  EXPECT_EQ(
      render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
             "{{ x }}{% endfor %}",
             R"({"xs": [1, 2, 3, 4, 5]})"),
      "13");
  EXPECT_EQ(render("{% for a, b in d.items() %}{{ a }}={{ b }};{% endfor %}", R"({"d": {"k": 1, "j": 2}})"),
            "k=1;j=2;");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for c in 'ab' %}{{ loop.cycle('x', 'y') }}{{ c }}{% endfor %}"), "xayb");
}

TEST(Jinja, ScopesNamespacesAndMacros) {
  EXPECT_EQ(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}"
                   "{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}{{ caller() if caller }}]{% endmacro %}"
                   "{% call m(1) %}body{% endcall %}{{ m(2, b=3) }}"),
            "[1Bbody][23]");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(
      render("{% set l = [] %}{% for i in range(3) %}{{ l.append(i) or '' }}{% endfor %}{{ l | join(',') }}"),
      "0,1,2");
}

TEST(Jinja, ReferenceCyclesRenderAndAreFreed) {
  // A list holding itself and a macro stored in its own scope: cycles the render breaks when it ends
  // (LeakSanitizer in the fuzz build checks the freeing).
  EXPECT_EQ(render("{% set l = [1] %}{{ l.append(l) or '' }}{{ l | length }}{{ l[1][1][0] }}"), "21");
  EXPECT_EQ(render("{% set ns = namespace() %}{% macro m() %}x{% endmacro %}{% set ns.m = m %}{{ ns.m() }}"),
            "x");
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("a \n {%- if true -%} \n b {%+ endif %}"), "ab ");
  EXPECT_EQ(render("  {{ 'k' }}\n{# c #}\nz\n"), "  k\nz");
}

// Unicode text as each dialect's reference has it. Expected strings were produced by the references
// themselves: @huggingface/jinja 0.5.13 (js_strip_quirk) and Python Jinja2 3.1 configured as transformers
// configures it (tojson = json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)).
TEST(Jinja, UnicodeCaseWhitespaceAsEachDialect) {
  RenderOptions js;
  js.js_strip_quirk = true;
  const std::string words = R"({"s": "élan ßtraße ǆx ΣΑΣ 1abc o'neil x2y hello_world foo-bar İ ﬁ they're"})";
  // Upper / lower: full mappings (ß -> SS, ﬁ -> FI, İ -> i + combining dot, final sigma), both dialects.
  for (const RenderOptions& o : {RenderOptions{}, js}) {
    EXPECT_EQ(render("{{ s | upper }}", words, o), "ÉLAN SSTRASSE ǄX ΣΑΣ 1ABC O'NEIL X2Y HELLO_WORLD FOO-BAR İ FI THEY'RE");
    EXPECT_EQ(render("{{ s.lower() }}", words, o), "élan ßtraße ǆx σας 1abc o'neil x2y hello_world foo-bar i̇ ﬁ they're");
    EXPECT_EQ(render("{{ s is upper }}{{ s is lower }}{{ 'ÉA' is upper }}{{ 'éa' is lower }}", words, o),
              o.js_strip_quirk ? "falsefalsetruetrue" : "FalseFalseTrueTrue");
  }
  // Title and capitalize differ: JavaScript's /\b\w/ upper-cases ASCII letters only and lowers nothing.
  EXPECT_EQ(render("{{ s | title }}", words, js), "éLan ßTraßE ǆX ΣΑΣ 1abc O'Neil X2y Hello_world Foo-Bar İ ﬁ They'Re");
  EXPECT_EQ(render("{{ s | capitalize }}|{{ 'ßa' | capitalize }}|{{ '𐐨a' | capitalize }}", words, js),
            "Élan ßtraße ǆx ΣΑΣ 1abc o'neil x2y hello_world foo-bar İ ﬁ they're|SSa|𐐨a");
  // Python: the filter is Jinja2's (split at '-', brackets, whitespace), the method str.title.
  EXPECT_EQ(render("{{ s | title }}", words), "Élan SStraße Ǆx Σας 1abc O'neil X2y Hello_world Foo-Bar İ FI They're");
  EXPECT_EQ(render("{{ s.title() }}", words), "Élan Sstraße ǅx Σας 1Abc O'Neil X2Y Hello_World Foo-Bar İ Fi They'Re");
  EXPECT_EQ(render("{{ s | capitalize }}|{{ 'ßa' | capitalize }}|{{ 'ǆX' | capitalize }}", words),
            "Élan ßtraße ǆx σας 1abc o'neil x2y hello_world foo-bar i̇ ﬁ they're|Ssa|ǅx");
  // Whitespace: U+00A0, U+2003, U+3000, U+2028 everywhere; U+0085 and U+001C for Python only, U+FEFF for
  // the reference only; U+200B (a format character) for neither.
  const std::string ws = R"({"s": "\u00a0\u2003\u3000\u2028\u0085\u001c\ufeff\u200bx\u200b\ufeff\u001c\u0085 \u00a0"})";
  EXPECT_EQ(render("[{{ s | trim }}]", ws, js), "[\u0085\u001c\ufeff\u200bx\u200b\ufeff\u001c\u0085]");
  EXPECT_EQ(render("[{{ s.strip() }}]", ws), "[\ufeff\u200bx\u200b\ufeff]");
  EXPECT_EQ(render("{{ s.split() | tojson }}", R"({"s": "\u00a0a\u0085b\u3000c "})", js), "[\"a\u0085b\", \"c\"]");
  EXPECT_EQ(render("{{ s.split() | tojson }}", R"({"s": "\u00a0a\u0085b\u3000c "})"), R"(["a", "b", "c"])");
  EXPECT_EQ(render("{{ s.split(none, 1) | tojson }}", R"({"s": " a  b c "})"), R"(["a", "b c "])");
  // strip(chars) takes characters, not bytes: 'é' does not eat the first byte of 'ê'.
  EXPECT_EQ(render("[{{ s.strip('éx') }}]", R"({"s": "éxêaéx"})"), "[êa]");
}

TEST(Jinja, TojsonTakesTransformersKeywords) {
  RenderOptions js;
  js.js_strip_quirk = true;
  const std::string d = R"({"d": {"b": 1, "a": [1, {"z": 2, "y": "é"}], "é": 3, "Z": 4}})";
  for (const RenderOptions& o : {RenderOptions{}, js}) {
    EXPECT_EQ(render("{{ d | tojson(separators=(',', ':')) }}", d, o), R"({"b":1,"a":[1,{"z":2,"y":"é"}],"é":3,"Z":4})");
    EXPECT_EQ(render("{{ d.a | tojson(indent=2, separators=(',', ' = ')) }}", d, o),
              "[\n  1,\n  {\n    \"z\" = 2,\n    \"y\" = \"é\"\n  }\n]");
    EXPECT_EQ(render("{{ s | tojson(ensure_ascii=true) }}", R"({"s": "é😀\u007f\u2028"})", o),
              R"("\u00e9\ud83d\ude00\u007f\u2028")");
  }
  // sort_keys: Python by code point, the reference by collation (localeCompare).
  EXPECT_EQ(render("{{ d | tojson(sort_keys=true) }}", d), R"({"Z": 4, "a": [1, {"y": "é", "z": 2}], "b": 1, "é": 3})");
  EXPECT_EQ(render("{{ d | tojson(sort_keys=true) }}", d, js), R"({"a": [1, {"y": "é", "z": 2}], "b": 1, "é": 3, "Z": 4})");
  // Positional arguments are transformers' order (ensure_ascii first); the reference ignores them, and
  // unknown keywords, and takes indent 0 as none.
  EXPECT_EQ(render("{{ 'é' | tojson(1) }}|{{ [1] | tojson(indent=0) }}"), "\"\\u00e9\"|[\n1\n]");
  EXPECT_EQ(render("{{ 'é' | tojson(1, foo=2) }}|{{ [1] | tojson(indent=0) }}", "{}", js), "\"é\"|[1]");
  EXPECT_NE(render("{{ 1 | tojson(foo=2) }}").find("ERROR"), std::string::npos);
  EXPECT_NE(render("{{ 1 | tojson(separators=',') }}").find("ERROR"), std::string::npos);
}

TEST(Jinja, FiltersAndMethods) {
  EXPECT_EQ(
      render("{{ d | tojson }}|{{ [1, 'é'] | tojson(indent=1) }}", R"({"d": {"b": [1, 2.5], "a": null}})"),
      "{\"b\": [1, 2.5], \"a\": null}|[\n 1,\n \"é\"\n]");
  EXPECT_EQ(render("{{ '  a-b ' | trim }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') | length }}"),
            "a-b|a|4");
  RenderOptions js;
  js.js_strip_quirk = true;
  EXPECT_EQ(render("{{ '\\n  a'.lstrip('\\n') }}", "{}", js), "a");
  EXPECT_EQ(render("{{ '\\n  a'.lstrip('\\n') }}"), "  a");
  EXPECT_EQ(render("{{ xs | map(attribute='n') | select('odd') | list }}",
                   R"({"xs": [{"n": 1}, {"n": 2}, {"n": 3}]})"),
            "[1, 3]");
  EXPECT_EQ(render("{{ xs | rejectattr('n', 'equalto', 2) | map(attribute='n') | join }}",
                   R"({"xs": [{"n": 1}, {"n": 2}, {"n": 3}]})"),
            "13");
  EXPECT_EQ(render("{{ 'Hello World'.upper() }} {{ 'ab'.title() }} {{ x | default('d') }} {{ [3,1,2] | sort "
                   "| first }}"),
            "HELLO WORLD Ab d 1");
  EXPECT_EQ(
      render(
          "{{ 'a' is string }}{{ 1 is not string }}{{ {} is mapping }}{{ x is defined }}{{ none is none }}"),
      "TrueTrueTrueFalseTrue");
}

TEST(Jinja, GlobalsAndErrors) {
  RenderOptions o;
  std::tm tm{};
  tm.tm_year = 126;
  tm.tm_mon = 0;
  tm.tm_mday = 15;
  o.now = tm;
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d') }}", "{}", o), "2026-01-15");
  auto r = car::chat::render_template("{{ raise_exception('no system role') }}", Value::dict());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "raise_exception");
  EXPECT_EQ(r.error().message, "no system role");
  // Syntax errors name the construct and the position.
  EXPECT_EQ(render("ab\n  {% include 'x' %}"),
            "ERROR[template_syntax] line 2:6: unsupported statement 'include'");
  EXPECT_EQ(
      render("{% if x %}"),
      "ERROR[template_syntax] line 1:11: missing 'elif' or 'else' or 'endif' before the end of the template");
  EXPECT_EQ(render("{{ 1 +* 2 }}"), "ERROR[template_syntax] line 1:7: expected an expression, found '*'");
  EXPECT_EQ(render("{{ x | nope }}"), "ERROR[template_error] line 1:8: unknown filter 'nope'");
  EXPECT_EQ(render("{{ 1 // 0 }}"), "ERROR[template_error] line 1:4: integer division or modulo by zero");
  EXPECT_EQ(render("{% break %}"), "ERROR[template_syntax] line 1:4: 'break' outside a for loop");
}

// A conversation a template cannot express is an error, as the reference raises it, never text made up:
// tool-call arguments given as an object to a template that concatenates them as a string.
TEST(Jinja, ArgumentsObjectsConcatenatedAsTextRaise) {
  const std::string ctx = R"({"call": {"name": "f", "arguments": {"city": "Paris"}}})";
  for (bool js : {false, true}) {
    RenderOptions o;
    o.js_strip_quirk = js;
    const std::string tpl = "{{ '{\"name\": \"' + call.name + '\", \"arguments\": ' + call.arguments + '}' }}";
    const std::string out = render(tpl, ctx, o);
    EXPECT_EQ(out.rfind("ERROR[template_error]", 0), 0u) << out;
    EXPECT_NE(out.find("unsupported operand types for +"), std::string::npos) << out;
    EXPECT_EQ(render("{{ call.arguments + '!' }}", ctx, o).rfind("ERROR[template_error]", 0), 0u);
    // The templates made for objects serialise them, which works.
    EXPECT_EQ(render("{{ call.arguments | tojson }}", ctx, o), R"({"city": "Paris"})");
  }
}

TEST(Jinja, LimitsStopRunawayTemplates) {
  RenderOptions o;
  o.limits.max_steps = 10000;
  EXPECT_NE(render("{% for i in range(100000) %}{{ i }}{% endfor %}", "{}", o).find("steps"),
            std::string::npos);
  EXPECT_NE(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nest deeper"), std::string::npos);
  o = {};
  o.limits.max_string_bytes = 1000;
  EXPECT_NE(
      render("{% set s = namespace(v='ab') %}{% for i in range(20) %}{% set s.v = s.v ~ s.v %}{% endfor %}",
             "{}", o)
          .find("exceeds"),
      std::string::npos);
  EXPECT_NE(render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("nests deeper"),
            std::string::npos);
}

TEST(Chat, RenderChatBuildsTheTransformersContext) {
  const std::string tpl =
      "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}{% if tools is defined and tools is none %}!{% "
      "endif %}";
  car::chat::ChatOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  auto r = car::chat::render_chat(tpl, json::parse(R"([{"role":"user","content":"hi"}])"), o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "<s><|user|>hi</s><|assistant|>!");
  o.add_generation_prompt = false;
  EXPECT_EQ(*car::chat::render_chat(tpl, json::parse(R"([{"role":"user","content":"hi"}])"), o),
            "<s><|user|>hi</s>!");
  auto bad = car::chat::render_chat(tpl, json::parse(R"([{"content":"hi"}])"), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, "bad_messages");
}

}  // namespace
