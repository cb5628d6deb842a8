// Request lines (daemon/protocol/request.h): ids echoed as sent, the compact fast path, malformed lines
// answered with their id, and the nesting bound.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "daemon/protocol.h"

namespace car {
namespace {

using nlohmann::json;

TEST(DaemonProtocol, ParsesRequestsAndKeepsScalarIds) {
  json id;
  auto r = protocol::parse_request(R"({"id": "x-1", "op": "health"})", &id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->op, "health");
  EXPECT_EQ(r->id, "x-1");
  for (const char* line :
       {R"({"id": 7, "op": "list"})", R"({"id": -7, "op": "list"})", R"({"id": false, "op": "list"})",
        R"({"id": null, "op": "list"})", R"({"op": "list"})", R"({"id": 0, "op": "list"})"}) {
    EXPECT_TRUE(protocol::parse_request(line, nullptr).ok()) << line;
  }
}

TEST(DaemonProtocol, NumericIdsAreIntegersEchoedAsSentOrRejected) {
  // The extremes of int64 and uint64 come back spelled as they were sent.
  for (const char* raw : {"-9223372036854775808", "18446744073709551615", "0", "42", "-1"}) {
    json id;
    const std::string line = std::string(R"({"op": "health", "id": )") + raw + "}";
    auto r = protocol::parse_request(line, &id);
    ASSERT_TRUE(r.ok()) << line;
    EXPECT_EQ(protocol::dump(r->id), raw);
    EXPECT_NE(protocol::ok_line(r->id, {}).find(std::string("\"id\":") + raw + ","), std::string::npos);
  }
  // What the parsed value would spell differently is rejected, with a null id in the error reply.
  for (const char* raw : {"-0", "-0.0", "2.5", "1.0", "1e3", "1E+2", "18446744073709551616",
                          "-9223372036854775809", "123456789012345678901234567890"}) {
    json id = "before";
    for (const std::string& line : {std::string(R"({"op": "health", "id": )") + raw + "}",
                                    std::string(R"({ "id" : )") + raw + R"( , "op": "health"})",
                                    std::string(R"({"id": 1, "op": "health", "\u0069d": )") + raw + "}"}) {
      auto r = protocol::parse_request(line, &id);
      ASSERT_FALSE(r.ok()) << line;
      EXPECT_EQ(r.error().code, "bad_request");
      EXPECT_NE(r.error().message.find("integer"), std::string::npos) << r.error().message;
      EXPECT_TRUE(id.is_null()) << line;
    }
  }
  // A key that merely contains "id", or an id inside another member, does not count.
  EXPECT_TRUE(protocol::parse_request(R"({"idx": -0, "op": "health", "id": 0})", nullptr).ok());
  EXPECT_TRUE(protocol::parse_request(R"({"x": {"id": -0}, "op": "health", "id": 0})", nullptr).ok());
  EXPECT_TRUE(protocol::parse_request(R"({"x": "\"id\": -0", "id": 0, "op": "health"})", nullptr).ok());
  EXPECT_FALSE(protocol::parse_request(R"({"id": 0, "op": "health", "id": -0})", nullptr).ok())
      << "the last wins";
}

TEST(DaemonProtocol, CompactRequestsParseAsTheDocumentSays) {
  // parse_request reads `{"id":N,"op":"NAME"}` of a field-less op by hand; for every line, hand-read or
  // not, the result must be what the JSON document says: the same op, the same id of the same JSON type,
  // and the same error where the full parser refuses. The lines cover the compact form's every edge.
  const std::vector<std::string> ids = {"",  "0",  "7",  "-7", "-0", "01", "-01", "123456789012345678",
                                        "-123456789012345678", "1234567890123456789", "18446744073709551615",
                                        "-9223372036854775808", "1.5", "1e3", "\"s\"", "true", "null", "-"};
  const std::vector<std::string> ops = {"health", "stats", "list", "metrics", "infer", "cancel", "load",
                                        "healthy", "Health", "", "heal\u0074h"};
  int accepted = 0;
  for (const auto& id_text : ids) {
    for (const auto& op : ops) {
      for (const std::string& tail : {std::string("}"), std::string(" }"), std::string("}\r"), std::string("},"),
                                      std::string(R"(,"strict":false})")}) {
        const std::string line =
            (id_text.empty() ? std::string("{") : R"({"id":)" + id_text + ",") + R"("op":")" + op + "\"" + tail;
        json id = "before";
        auto r = protocol::parse_request(line, &id);
        json doc = json::parse(line, nullptr, /*allow_exceptions=*/false);
        const bool valid = !doc.is_discarded() && doc.is_object();
        if (!valid) {
          EXPECT_FALSE(r.ok()) << line;
          continue;
        }
        const json expected_id = doc.contains("id") ? doc["id"] : json();
        if (!r.ok()) {
          // Refused by the full parser (a -0, a fraction, a non-scalar...): never by the compact one.
          EXPECT_TRUE(expected_id.is_number() || !doc["op"].is_string()) << line << ": " << r.error().message;
          continue;
        }
        ++accepted;
        EXPECT_EQ(r->op, doc["op"].get<std::string>()) << line;
        EXPECT_EQ(r->id, expected_id) << line;
        EXPECT_EQ(r->id.type(), expected_id.type()) << line;
        EXPECT_EQ(id, expected_id) << line;
        EXPECT_EQ(protocol::dump(r->id), protocol::dump(expected_id)) << line;
        EXPECT_TRUE(r->body.is_object()) << line;
        // What the handler reads from the body: the fields check, and for ops with fields the fields.
        if (auto op_known = protocol::op_from_name(r->op)) {
          EXPECT_EQ(protocol::check_fields(*op_known, r->body).ok(),
                    protocol::check_fields(*op_known, doc).ok())
              << line;
          EXPECT_EQ(protocol::model_field(r->body).ok(), protocol::model_field(doc).ok()) << line;
        }
      }
    }
  }
  EXPECT_GT(accepted, 100);
}

TEST(DaemonProtocol, RejectsMalformedRequestsWithTheirId) {
  json id;
  auto no_op = protocol::parse_request(R"({"id": 9})", &id);
  ASSERT_FALSE(no_op.ok());
  EXPECT_EQ(no_op.error().code, "bad_request");
  EXPECT_EQ(id, 9);  // the error reply can still carry the id
  for (const char* line : {"", "nope", "[]", "42", R"({"op": 1})", R"({"id": [1], "op": "health"})",
                           R"({"id": {}, "op": "health"})", "{\"op\": \"health\"", "\xff\xfe"}) {
    auto r = protocol::parse_request(line, &id);
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_EQ(r.error().code, "bad_request") << line;
  }
}

// Issue #23: copying, dumping and comparing a document recurse, and so does converting messages for a chat
// template, so a line nesting deeper than kMaxRequestDepth is refused before it is parsed (its id still
// echoed); anything up to it parses.
TEST(DaemonProtocol, RefusesRequestsNestedTooDeep) {
  EXPECT_FALSE(protocol::nests_deeper_than(R"({"a":[[1]]})", 3));
  EXPECT_TRUE(protocol::nests_deeper_than(R"({"a":[[[1]]]})", 3));
  EXPECT_FALSE(protocol::nests_deeper_than(R"({"a":"[[[[[[\"[[[["})", 1));  // brackets in strings
  EXPECT_FALSE(protocol::nests_deeper_than(R"({"a\\":"[[[["})", 1));        // an escaped backslash
  const int limit = protocol::kMaxRequestDepth;
  auto line = [](int content_depth, const std::string& id) {
    return R"({"id":)" + id + R"(,"op":"infer","model":"m","messages":[{"role":"user","content":)" +
           std::string(static_cast<size_t>(content_depth), '[') +
           std::string(static_cast<size_t>(content_depth), ']') + "}]}";
  };
  json id;
  auto ok = protocol::parse_request(line(limit - 3, "1"), &id);  // object, messages, message: 3 levels
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  for (const std::string& sid : {std::string("7"), std::string(R"("seven")")}) {
    for (int depth : {limit - 2, 30000}) {
      auto r = protocol::parse_request(line(depth, sid), &id);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error().code, "bad_request");
      EXPECT_NE(r.error().message.find("nests deeper than 128"), std::string::npos) << r.error().message;
      EXPECT_EQ(id, json::parse(sid));
    }
  }
}

}  // namespace
}  // namespace car
