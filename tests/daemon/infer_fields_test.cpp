// The infer field table (CAR_INFER_FIELDS, daemon/protocol/schema.h): docs/protocol.md's `infer` table lists
// exactly its fields with their JSON types and ranges, the op's known fields are its names, every numeric
// row refuses values just outside its range naming the field, and InferBuilder gives what parse_infer gives.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "daemon/protocol.h"

#ifndef CAR_SOURCE_DIR
#error "CAR_SOURCE_DIR must name the source tree (tests/daemon/CMakeLists.txt)"
#endif

namespace car {
namespace {

using nlohmann::json;
using protocol::FieldType;
using protocol::InferField;
using protocol::kInferFields;

/// docs/protocol.md's `infer` table: field name -> its "type" cell, in the order written.
std::vector<std::pair<std::string, std::string>> documented_infer_fields() {
  std::ifstream in(std::string(CAR_SOURCE_DIR) + "/docs/protocol.md");
  EXPECT_TRUE(in.good()) << "cannot read docs/protocol.md";
  std::vector<std::pair<std::string, std::string>> rows;
  std::string line;
  bool in_section = false;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("### ", 0) == 0) in_section = line == "### `infer`";
    if (!in_section) continue;
    if (line.rfind("| `", 0) != 0) {
      if (in_table) break;  // the first table of the section ended
      continue;
    }
    in_table = true;
    const std::size_t name_end = line.find('`', 3);
    const std::size_t type_start = line.find("| ", name_end) + 2;
    const std::size_t type_end = line.find(" |", type_start);
    rows.emplace_back(line.substr(3, name_end - 3), line.substr(type_start, type_end - type_start));
  }
  return rows;
}

/// How the docs spell the start of a type cell.
std::string type_word(FieldType type) {
  switch (type) {
    case FieldType::kString:
      return "string";
    case FieldType::kInteger:
      return "integer";
    case FieldType::kNumber:
      return "number";
    case FieldType::kBoolean:
      return "boolean";
    case FieldType::kStrings:
      return "string or array of";
    case FieldType::kMessages:
      return "array of";
    case FieldType::kStreamExperts:
      return "`\"on\"`";
  }
  return "?";
}

TEST(InferFields, DocsListEveryFieldOfTheTableWithItsTypeAndRange) {
  const auto documented = documented_infer_fields();
  std::map<std::string, std::string> by_name;
  for (const auto& [name, type] : documented) {
    EXPECT_TRUE(by_name.emplace(name, type).second) << "docs/protocol.md lists `" << name << "` twice";
  }
  for (const auto& f : kInferFields) {
    const std::string name(f.name);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      ADD_FAILURE() << "docs/protocol.md's infer table does not list `" << name << "`";
      continue;
    }
    const std::string& cell = it->second;
    EXPECT_EQ(cell.rfind(type_word(f.type), 0), 0u) << name << ": the docs say \"" << cell << "\"";
    // A range written as lo..hi must be the row's.
    if (const auto dots = cell.find(".."); dots != std::string::npos) {
      const std::size_t lo_start = cell.rfind(' ', dots) + 1;
      char* end = nullptr;
      const std::string hi_text = cell.substr(dots + 2);
      const double hi = std::strtod(hi_text.c_str(), &end);
      if (end != hi_text.c_str() && *end != '^') {  // "2^64-1" is spelled for people
        EXPECT_EQ(std::strtod(cell.c_str() + lo_start, nullptr), f.lo) << name << ": \"" << cell << "\"";
        EXPECT_EQ(hi, f.hi) << name << ": \"" << cell << "\"";
      }
    }
    by_name.erase(it);
  }
  for (const auto& [name, type] : by_name) {
    ADD_FAILURE() << "docs/protocol.md's infer table lists `" << name << "`, which CAR_INFER_FIELDS lacks";
  }
}

TEST(InferFields, TheOpsKnownFieldsAreTheTablesNames) {
  const auto& known = protocol::known_fields(protocol::Op::kInfer);
  ASSERT_EQ(known.size(), protocol::kInferFieldCount);
  for (std::size_t i = 0; i < known.size(); ++i) EXPECT_EQ(known[i], kInferFields[i].name);
}

TEST(InferFields, NumericRowsRefuseValuesJustOutsideTheirRangeNamingTheField) {
  const json base = {{"model", "m"}, {"prompt", "p"}};
  for (const auto& f : kInferFields) {
    if (f.type != FieldType::kInteger && f.type != FieldType::kNumber) continue;
    const std::string name(f.name);
    json at_bounds = base;
    at_bounds[name] = f.type == FieldType::kNumber ? json(f.hi) : json(static_cast<int64_t>(f.lo));
    EXPECT_TRUE(protocol::parse_infer(at_bounds).ok()) << name;
    std::vector<json> outside = {json(-1), json("1")};
    if (f.hi < 1e18) {
      outside.push_back(f.type == FieldType::kNumber ? json(f.hi * 1.5 + 1)
                                                     : json(static_cast<int64_t>(f.hi) + 1));
    }
    for (const json& v : outside) {
      json body = base;
      body[name] = v;
      auto r = protocol::parse_infer(body);
      ASSERT_FALSE(r.ok()) << name << " = " << v.dump();
      EXPECT_EQ(r.error().code, "bad_request");
      EXPECT_NE(r.error().message.find("'" + name + "'"), std::string::npos) << r.error().message;
    }
  }
}

TEST(InferFields, TheBuilderGivesWhatParseInferGives) {
  protocol::InferBuilder b;
  b.set(InferField::kModel, "m");
  b.set(InferField::kMessages, json::array({{{"role", "user"}, {"content", "hi"}}}));
  b.set(InferField::kTemperature, 0.5);
  b.set(InferField::kTopLogprobs, 3);
  b.set(InferField::kSeed, nullptr);  // null is absent
  b.set(InferField::kKeepAlive, 30);
  EXPECT_TRUE(b.given(InferField::kTemperature));
  EXPECT_FALSE(b.given(InferField::kSeed));
  auto built = std::move(b).finish();
  ASSERT_TRUE(built.ok()) << built.error().message;
  auto parsed = protocol::parse_infer({{"model", "m"},
                                       {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                       {"temperature", 0.5},
                                       {"top_logprobs", 3},
                                       {"seed", nullptr},
                                       {"keep_alive", 30}});
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(built->model, parsed->model);
  EXPECT_EQ(built->messages, parsed->messages);
  EXPECT_EQ(built->generate.sampling.temperature, parsed->generate.sampling.temperature);
  EXPECT_EQ(built->generate.top_logprobs, 3);
  EXPECT_TRUE(built->generate.logprobs);  // implied, as for parse_infer
  EXPECT_EQ(built->generate.logprobs, parsed->generate.logprobs);
  EXPECT_FALSE(built->seed_given);
  EXPECT_EQ(built->keep_alive, std::optional<std::chrono::seconds>(30));
  EXPECT_EQ(built->keep_alive, parsed->keep_alive);

  // A refused value is reported by finish(), after the whole-request checks.
  protocol::InferBuilder missing;
  missing.set(InferField::kTopP, 7);
  auto r = std::move(missing).finish();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'model' is missing"), std::string::npos) << r.error().message;
  protocol::InferBuilder refused;
  refused.set(InferField::kModel, "m");
  refused.set(InferField::kPrompt, "p");
  refused.set(InferField::kTopP, 7);
  auto t = std::move(refused).finish();
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("'top_p'"), std::string::npos) << t.error().message;
}

}  // namespace
}  // namespace car
