// corpus_chat OUT_DIR [CONFORMANCE_DIR]: seeds for fuzz_chat (a flags byte, then template text): built-in
// templates using each construct, and with the conformance folder every chat/templates/*.jinja and every
// language.json template (with its context after a NUL); long operator/attribute/filter chains and deeply
// nested contexts (issue #23).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: corpus_chat OUT_DIR [CONFORMANCE_DIR]\n");
    return 2;
  }
  const fs::path out = argv[1];
  fs::create_directories(out);
  int n = 0;
  auto emit = [&](const std::string& body, char flags) {
    std::ofstream f(out / ("seed_" + std::to_string(n++)), std::ios::binary);
    f << flags << body;
  };
  const std::vector<std::string> builtin = {
      "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}",
      "{% set ns = namespace(x=0) %}{% for i in range(n) if i is odd %}{% set ns.x = ns.x + i %}{% endfor "
      "%}{{ ns.x }}",
      "{%- macro r(m) -%}{{ m.role | upper }}{%- endmacro -%}{% for m in messages %}{{ r(m) }}{% else %}-{% "
      "endfor %}",
      "{% call(x) m() %}{{ x }}{% endcall %}{% macro m() %}{{ caller(1) }}{% endmacro %}",
      "{{ tools | tojson(indent=2) }}{{ messages | selectattr('role', 'equalto', 'user') | "
      "map(attribute='content') "
      "| list | length }}",
      "{{ 'a b c'.split(' ')[::-1] | join(',') }}{{ ('x' ~ f ~ n)[1:3] }}{{ {'k': [1, 2.5, none, true]} | "
      "items | list }}",
      "{% if messages[0].content is string and not (x is defined) %}{{ "
      "messages[0].content.strip().startswith('Y') }}"
      "{% elif f > 2 %}{{ raise_exception('bad') }}{% else %}{{ strftime_now('%d %b %Y') }}{% endif %}",
      "{% set s %}{% filter upper %}abc{% endfilter %}{% endset %}{{ s * 2 }}{{ 7 // 2 }}{{ 2 ** 8 }}{{ -7 % "
      "3 }}",
      "  {%- for k, v in tools[0].function | dictsort %}\n  {{ k }}={{ v }}\n{% endfor +%}\n{# c #}x",
  };
  for (const auto& b : builtin) {
    emit(b, 0);
    emit(b, 3);
  }
  // Issue #23: chains around and past the tree depth limit (256), and contexts nested around and past the
  // JSON depth limit (128), for the mutator to grow and vary.
  auto repeat = [](const std::string& link, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += link;
    return out;
  };
  for (int links : {50, 250, 300, 3000}) {
    for (const char* link : {"+1", ".a", "|e", "[0]", "()", " is defined", " ~ 'a'", "|default(1)"}) {
      emit("{{ x" + repeat(link, links) + " }}", 0);
    }
  }
  for (int depth : {100, 127, 129, 3000}) {
    const std::string arrays = repeat("[", depth) + "1" + repeat("]", depth);
    const std::string objects = repeat("{\"a\":", depth) + "1" + repeat("}", depth);
    emit(std::string("{{ messages[0].content }}") + '\0' + R"({"messages":[{"role":"user","content":)" +
             arrays + "}]}",
         0);
    emit(std::string("{{ x|tojson }}") + '\0' + R"({"x":)" + objects + "}", 0);
  }
  emit(
      "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x "
      "}}",
      0);
  if (argc > 2) {
    const fs::path chat = fs::path(argv[2]) / "chat";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(chat / "templates", ec)) {
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      emit(ss.str(), 1);
    }
    std::ifstream in(chat / "language.json");
    if (in) {
      const auto j = nlohmann::ordered_json::parse(in, nullptr, false);
      if (j.is_array()) {
        for (const auto& r : j) {
          if (!r.contains("template") || !r["template"].is_string()) continue;
          emit(r["template"].get<std::string>() + std::string(1, '\0') +
                   r.value("context", nlohmann::ordered_json::object()).dump(),
               0);
        }
      }
    }
  }
  std::printf("corpus_chat: %d seeds in %s\n", n, out.c_str());
  return 0;
}
