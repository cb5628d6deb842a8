// The shared chat-template conformance set (../shared/conformance/chat, README.md there): every case must
// render byte-identically to @huggingface/jinja's output, or fail where it failed (with exactly the
// template's message for raise_exception). Rendered in the reference's dialect (js_strip_quirk) and again
// in the Python (transformers) dialect, where only the records carrying a `note` may differ.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/chat/jinja.h"
#include "tests/test_support.h"

namespace {

using car::chat::RenderOptions;
using car::chat::Template;
using car::chat::Value;
using json = nlohmann::ordered_json;

RenderOptions fixed_clock(bool js) {
  RenderOptions o;
  o.js_strip_quirk = js;
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 0;
  tm.tm_mday = 15;
  tm.tm_wday = 4;  // a Thursday
  tm.tm_yday = 14;
  o.now = tm;
  return o;
}

struct Tally {
  int total = 0, matched = 0, errors_expected = 0;
};

// Renders every record of `file`; `load_template` gives the source of a record's template.
template <typename Loader>
Tally run_file(const std::filesystem::path& file, Loader load_template, bool js) {
  Tally t;
  const auto text = car::testing::read_fixture(file);
  EXPECT_TRUE(text.has_value()) << "missing " << file;
  if (!text) return t;
  const json records = json::parse(*text);
  EXPECT_TRUE(records.is_array());
  for (const auto& r : records) {
    const std::string id = r.at("id");
    if (!js && r.contains("note")) continue;  // the two engines differ here by design
    ++t.total;
    const std::string source = load_template(r);
    const Value context = Value::from_json(r.at("context"));
    auto tpl = Template::parse(source);
    car::Result<std::string> out =
        tpl.ok() ? tpl->render(context, fixed_clock(js)) : car::Result<std::string>(tpl.error());
    if (r.contains("expected")) {
      const std::string expected = r.at("expected");
      if (!out.ok()) {
        ADD_FAILURE() << id << ": expected a render, got error " << out.error().code << ": "
                      << out.error().message;
      } else if (*out != expected) {
        ADD_FAILURE() << id << ": render differs\n--- expected\n" << expected << "\n--- got\n" << *out;
      } else {
        ++t.matched;
      }
    } else {
      ++t.errors_expected;
      const std::string kind = r.at("error_kind");
      if (out.ok()) {
        ADD_FAILURE() << id << ": expected an error (" << r.at("error").get<std::string>()
                      << "), got a render:\n"
                      << *out;
      } else if (kind == "raise_exception" && (out.error().code != "raise_exception" ||
                                               out.error().message != r.at("error").get<std::string>())) {
        ADD_FAILURE() << id << ": expected raise_exception '" << r.at("error").get<std::string>() << "', got "
                      << out.error().code << ": " << out.error().message;
      } else {
        ++t.matched;
      }
    }
  }
  return t;
}

void check_cases(bool js) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto chat = dir / "chat";
  ASSERT_TRUE(std::filesystem::is_directory(chat)) << chat << " is missing";
  const Tally t = run_file(
      chat / "cases.json",
      [&](const json& r) {
        const auto src =
            car::testing::read_fixture(chat / "templates" / (r.at("template").get<std::string>() + ".jinja"));
        EXPECT_TRUE(src.has_value()) << "missing template " << r.at("template");
        return src.value_or("");
      },
      js);
  if (js) {
    EXPECT_EQ(t.total, 249);
    EXPECT_EQ(t.errors_expected, 29);
  }
  EXPECT_EQ(t.matched, t.total);
  std::printf("chat cases (%s dialect): %d of %d match (%d expected errors)\n", js ? "js" : "python",
              t.matched, t.total, t.errors_expected);
}

void check_language(bool js) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const Tally t = run_file(
      dir / "chat" / "language.json", [](const json& r) { return r.at("template").get<std::string>(); }, js);
  EXPECT_EQ(t.total, 65);
  EXPECT_EQ(t.matched, t.total);
  std::printf("language cases (%s dialect): %d of %d match\n", js ? "js" : "python", t.matched, t.total);
}

TEST(ChatConformance, CasesMatchTheReference) {
  check_cases(true);
}
TEST(ChatConformance, CasesMatchInThePythonDialectExceptNotedOnes) {
  check_cases(false);
}
TEST(ChatConformance, LanguageCasesMatchTheReference) {
  check_language(true);
}
TEST(ChatConformance, LanguageCasesMatchInThePythonDialect) {
  check_language(false);
}

}  // namespace
