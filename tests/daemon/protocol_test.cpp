// The wire protocol's pure parts: request parsing and validation, reply builders, line framing, and the
// error-code table against docs/protocol.md. (The resolver, worker pool, connection limits and safe_text have
// their own files beside this one.)
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/error_codes.h"
#include "daemon/protocol.h"
#include "tests/test_support.h"

#ifndef CAR_SOURCE_DIR
#error "CAR_SOURCE_DIR must name the source tree (tests/daemon/CMakeLists.txt)"
#endif

namespace car {
namespace {

using nlohmann::json;
using protocol::LineFramer;

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

TEST(DaemonProtocol, ValidatesInferFields) {
  json ok = {{"model", "m"}, {"prompt", "p"}, {"max_tokens", 8}, {"temperature", 0}, {"top_k", 5},
             {"top_p", 0.5}, {"seed", 42}, {"stop", {"\n", "END"}}, {"stream", true}};
  auto p = protocol::parse_infer(ok);
  ASSERT_TRUE(p.ok()) << p.error().message;
  // Parsed straight into the engine's request.
  const engine::GenerateRequest& g = p->generate;
  EXPECT_EQ(g.prompt, "p");
  EXPECT_EQ(g.max_tokens, 8);
  EXPECT_EQ(g.sampling.temperature, 0.0f);
  EXPECT_EQ(g.sampling.top_k, 5);
  EXPECT_EQ(g.sampling.top_p, 0.5f);
  EXPECT_EQ(g.sampling.seed, 42u);
  EXPECT_TRUE(p->seed_given);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(p->stream);
  EXPECT_FALSE(g.logprobs);
  EXPECT_EQ(g.top_logprobs, 0);
  auto single_stop = protocol::parse_infer({{"model", "m"}, {"prompt", "p"}, {"stop", "x"}, {"max_tokens", 4.0}});
  ASSERT_TRUE(single_stop.ok());
  EXPECT_EQ(single_stop->generate.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(single_stop->generate.max_tokens, 4);
  EXPECT_FALSE(single_stop->seed_given);
  // Absent sampling fields keep the engine's defaults.
  const engine::SamplingParams defaults;
  EXPECT_EQ(single_stop->generate.sampling.temperature, defaults.temperature);
  EXPECT_EQ(single_stop->generate.sampling.min_p, defaults.min_p);
  EXPECT_EQ(single_stop->generate.sampling.repeat_last_n, defaults.repeat_last_n);

  auto more = protocol::parse_infer({{"model", "m"},
                                     {"prompt", "p"},
                                     {"min_p", 0.1},
                                     {"repeat_penalty", 1.3},
                                     {"repeat_last_n", 32},
                                     {"ignore_eos", true},
                                     {"top_logprobs", 3}});
  ASSERT_TRUE(more.ok()) << more.error().message;
  EXPECT_FLOAT_EQ(more->generate.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(more->generate.sampling.repeat_penalty, 1.3f);
  EXPECT_EQ(more->generate.sampling.repeat_last_n, 32);
  EXPECT_TRUE(more->generate.ignore_eos);
  EXPECT_EQ(more->generate.top_logprobs, 3);
  EXPECT_TRUE(more->generate.logprobs);  // implied by top_logprobs
  auto just_logprobs = protocol::parse_infer({{"model", "m"}, {"prompt", "p"}, {"logprobs", true}});
  ASSERT_TRUE(just_logprobs.ok());
  EXPECT_TRUE(just_logprobs->generate.logprobs);
  EXPECT_EQ(just_logprobs->generate.top_logprobs, 0);

  const std::vector<std::pair<json, std::string>> bad = {
      {{{"prompt", "p"}}, "model"},
      {{{"model", 3}, {"prompt", "p"}}, "model"},
      {{{"model", "m"}}, "prompt"},
      {{{"model", "m"}, {"prompt", "p"}, {"max_tokens", -1}}, "max_tokens"},
      {{{"model", "m"}, {"prompt", "p"}, {"max_tokens", 1.5}}, "max_tokens"},
      {{{"model", "m"}, {"prompt", "p"}, {"max_tokens", 1e12}}, "max_tokens"},
      {{{"model", "m"}, {"prompt", "p"}, {"max_tokens", "8"}}, "max_tokens"},
      {{{"model", "m"}, {"prompt", "p"}, {"temperature", -1}}, "temperature"},
      {{{"model", "m"}, {"prompt", "p"}, {"top_p", 1.5}}, "top_p"},
      {{{"model", "m"}, {"prompt", "p"}, {"top_k", -2}}, "top_k"},
      {{{"model", "m"}, {"prompt", "p"}, {"seed", -2}}, "seed"},
      {{{"model", "m"}, {"prompt", "p"}, {"stop", {""}}}, "stop"},
      {{{"model", "m"}, {"prompt", "p"}, {"stop", 5}}, "stop"},
      {{{"model", "m"}, {"prompt", "p"}, {"stream", "yes"}}, "stream"},
      {{{"model", "m"}, {"prompt", "p"}, {"min_p", 2}}, "min_p"},
      {{{"model", "m"}, {"prompt", "p"}, {"repeat_penalty", 0}}, "repeat_penalty"},
      {{{"model", "m"}, {"prompt", "p"}, {"repeat_penalty", -1}}, "repeat_penalty"},
      {{{"model", "m"}, {"prompt", "p"}, {"repeat_last_n", -1}}, "repeat_last_n"},
      {{{"model", "m"}, {"prompt", "p"}, {"logprobs", 1}}, "logprobs"},
      {{{"model", "m"}, {"prompt", "p"}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"model", "m"}, {"prompt", "p"}, {"top_logprobs", -1}}, "top_logprobs"},
  };
  for (const auto& [body, field] : bad) {
    auto r = protocol::parse_infer(body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.error().code, "bad_request");
    EXPECT_NE(r.error().message.find(field), std::string::npos) << r.error().message;
  }
}

TEST(DaemonProtocol, UnknownFieldsAreBadRequestsNamingThem) {
  using protocol::Op;
  auto typo = protocol::check_fields(
      Op::kInfer, {{"op", "infer"}, {"model", "m"}, {"prompt", "p"}, {"tempreature", 0.5}});
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.error().code, "bad_request");
  EXPECT_NE(typo.error().message.find("unknown field 'tempreature' for op 'infer'"), std::string::npos)
      << typo.error().message;
  EXPECT_NE(typo.error().message.find("did you mean 'temperature'"), std::string::npos)
      << typo.error().message;
  // Far from every known field: the message lists them instead of guessing.
  auto far = protocol::check_fields(Op::kLoad, {{"op", "load"}, {"model", "m"}, {"xyzzy", 1}});
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.error().message.find("'xyzzy'"), std::string::npos);
  EXPECT_NE(far.error().message.find("known: model, stream_experts, keep_alive"), std::string::npos)
      << far.error().message;
  EXPECT_EQ(far.error().message.find("did you mean"), std::string::npos);
  // Per op: a field of infer is unknown to stats; id, op and strict are known everywhere.
  EXPECT_FALSE(protocol::check_fields(Op::kStats, {{"op", "stats"}, {"model", "m"}}).ok());
  EXPECT_TRUE(protocol::check_fields(Op::kStats, {{"id", 1}, {"op", "stats"}, {"strict", true}}).ok());
  EXPECT_TRUE(protocol::check_fields(Op::kCancel, {{"op", "cancel"}, {"target", 3}}).ok());
  // Every field parse_infer reads is known to infer.
  EXPECT_TRUE(protocol::check_fields(Op::kInfer, {{"op", "infer"},
                                                  {"model", "m"},
                                                  {"prompt", "p"},
                                                  {"messages", nullptr},
                                                  {"add_generation_prompt", true},
                                                  {"chat_template", "t"},
                                                  {"max_tokens", 1},
                                                  {"temperature", 0},
                                                  {"top_k", 1},
                                                  {"top_p", 1},
                                                  {"min_p", 0},
                                                  {"repeat_penalty", 1},
                                                  {"repeat_last_n", 64},
                                                  {"seed", 1},
                                                  {"stop", "x"},
                                                  {"stream", false},
                                                  {"ignore_eos", false},
                                                  {"logprobs", true},
                                                  {"top_logprobs", 2},
                                                  {"stream_experts", "auto"},
                                                  {"num_ctx", 64},
                                                  {"keep_alive", 0}})
                  .ok());
  EXPECT_TRUE(protocol::check_fields(Op::kLoad, {{"op", "load"}, {"model", "m"}, {"keep_alive", 30}}).ok());
  // The escape hatch, and a strict that is not a boolean.
  EXPECT_TRUE(
      protocol::check_fields(Op::kInfer, {{"op", "infer"}, {"tempreature", 1}, {"strict", false}}).ok());
  auto bad_strict = protocol::check_fields(Op::kHealth, {{"op", "health"}, {"strict", "no"}});
  ASSERT_FALSE(bad_strict.ok());
  EXPECT_NE(bad_strict.error().message.find("strict"), std::string::npos);
  // A hostile key is quoted as JSON in the message.
  auto odd = protocol::check_fields(Op::kHealth, {{"op", "health"}, {"a'\nb", 1}});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("\"a'\\nb\""), std::string::npos) << odd.error().message;
}

TEST(DaemonProtocol, KeepAliveIsWholeSecondsOrAbsent) {
  EXPECT_EQ(protocol::keep_alive_field(json{{"model", "m"}}).value(), std::nullopt);
  EXPECT_EQ(protocol::keep_alive_field(json{{"keep_alive", nullptr}}).value(), std::nullopt);
  EXPECT_EQ(protocol::keep_alive_field(json{{"keep_alive", 0}}).value(), std::optional<int64_t>(0));
  EXPECT_EQ(protocol::keep_alive_field(json{{"keep_alive", 300.0}}).value(), std::optional<int64_t>(300));
  for (const json& bad : {json(-1), json(1.5), json("5m"), json(true), json::array()}) {
    auto r = protocol::keep_alive_field(json{{"keep_alive", bad}});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, "bad_request");
    EXPECT_NE(r.error().message.find("keep_alive"), std::string::npos) << r.error().message;
  }
  EXPECT_FALSE(protocol::keep_alive_field(json{{"keep_alive", protocol::kMaxKeepAliveSecs + 1}}).ok());
}

TEST(DaemonProtocol, TokenEventsAndResultsCarryLogprobs) {
  protocol::TokenLogprobs lp;
  lp.token = 7;
  lp.text = " a";
  lp.logprob = -0.25;
  lp.top_logprobs = {{7, " a", -0.25}, {9, " b", -1.5}};
  const json entry = protocol::logprobs_json(lp);
  EXPECT_EQ(
      entry,
      json::parse(
          R"({"token":7,"text":" a","logprob":-0.25,"top_logprobs":[{"token":7,"text":" a","logprob":-0.25},{"token":9,"text":" b","logprob":-1.5}]})"));
  const json with = json::parse(protocol::token_line(3, protocol::TokenEvent{7, " a", lp}));
  EXPECT_EQ(with["logprob"], -0.25);
  EXPECT_EQ(with["top_logprobs"], entry["top_logprobs"]);
  EXPECT_EQ(with["text"], " a");
  const json without = json::parse(protocol::token_line(3, protocol::TokenEvent{7, " a", std::nullopt}));
  EXPECT_FALSE(without.contains("logprob"));
  EXPECT_FALSE(without.contains("top_logprobs"));
}

TEST(DaemonProtocol, ValidatesChatMessages) {
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hi"}, {"name", "ann"}},
                                     {{"role", "assistant"}, {"content", nullptr}}});
  auto p = protocol::parse_infer({{"model", "m"}, {"messages", messages}, {"add_generation_prompt", false},
                                  {"chat_template", "{{ messages[0].content }}"}});
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_TRUE(p->messages.has_value());
  EXPECT_EQ(*p->messages, messages);  // passed on whole, extra fields included
  EXPECT_TRUE(p->generate.prompt.empty());
  EXPECT_FALSE(p->add_generation_prompt);
  EXPECT_EQ(*p->chat_template, "{{ messages[0].content }}");
  auto defaults = protocol::parse_infer({{"model", "m"}, {"messages", messages}});
  ASSERT_TRUE(defaults.ok());
  EXPECT_TRUE(defaults->add_generation_prompt);
  EXPECT_FALSE(defaults->chat_template.has_value());

  const std::vector<std::pair<json, std::string>> bad = {
      {{{"model", "m"}, {"prompt", "p"}, {"messages", messages}}, "not both"},
      {{{"model", "m"}, {"messages", json::array()}}, "messages"},
      {{{"model", "m"}, {"messages", "hi"}}, "messages"},
      {{{"model", "m"}, {"messages", {1}}}, "messages[0]"},
      {{{"model", "m"}, {"messages", {{{"content", "x"}}}}}, "messages[0].role"},
      {{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", 5}}}}}, "messages[0].content"},
      {{{"model", "m"}, {"messages", messages}, {"add_generation_prompt", "yes"}}, "add_generation_prompt"},
      {{{"model", "m"}, {"messages", messages}, {"chat_template", 3}}, "chat_template"},
      {{{"model", "m"}, {"prompt", "p"}, {"chat_template", "x"}}, "chat_template"},
  };
  for (const auto& [body, what] : bad) {
    auto r = protocol::parse_infer(body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.error().code, "bad_request");
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }
}

TEST(DaemonProtocol, BuildsAndParsesReplies) {
  auto ok = protocol::parse_reply(protocol::ok_line(3, {{"status", "ok"}}));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->ok);
  EXPECT_EQ(ok->id, 3);
  EXPECT_EQ(ok->result["status"], "ok");
  auto err = protocol::parse_reply(protocol::error_line("a", "not_found", "no such model"));
  ASSERT_TRUE(err.ok());
  EXPECT_FALSE(err->ok);
  EXPECT_EQ(err->error_code, "not_found");
  EXPECT_EQ(err->error_message, "no such model");
  // Token text that is not valid UTF-8 (a model may split a character) still makes a valid line.
  auto ev =
      protocol::parse_reply(protocol::token_line(1, protocol::TokenEvent{17, "\xe2\x82", std::nullopt}));
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE(ev->is_event);
  EXPECT_EQ(ev->raw["token"], 17);
  EXPECT_FALSE(protocol::parse_reply("{}").ok());
  EXPECT_FALSE(protocol::parse_reply("garbage").ok());
}

TEST(DaemonProtocol, ReplyLinesAreTheSerializedDocuments) {
  // The builders write the members as text; the bytes must equal the serialized document (keys sorted,
  // compact, invalid UTF-8 replaced) for every kind of id and value.
  const nlohmann::json ids[] = {nullptr, 0, -7, 18446744073709551615ull, "r\"1\n", true};
  const nlohmann::json results[] = {
      nullptr, nlohmann::json::object(), 2.5, {{"status", "ok"}, {"uptime_s", 0.125}, {"engine", "e\xff"}}};
  for (const auto& id : ids) {
    for (const auto& result : results) {
      EXPECT_EQ(protocol::ok_line(id, result),
                protocol::dump(nlohmann::json{{"id", id}, {"ok", true}, {"result", result}}));
    }
    for (std::string_view message : {"", "no such model", "bad \xc3 byte \x01 \u2028"}) {
      EXPECT_EQ(protocol::error_line(id, "not_found", message),
                protocol::dump(nlohmann::json{
                    {"id", id}, {"ok", false}, {"error", {{"code", "not_found"}, {"message", message}}}}));
    }
    for (std::string_view text : {"", " the", "\xe2\x82", "\"\\\t"}) {
      EXPECT_EQ(
          protocol::token_line(id, protocol::TokenEvent{-3, std::string(text), std::nullopt}),
          protocol::dump(nlohmann::json{{"id", id}, {"event", "token"}, {"text", text}, {"token", -3}}));
    }
  }
}

TEST(DaemonProtocol, OpsAndWireCodesComeFromOneTable) {
  EXPECT_EQ(protocol::op_from_name("health"), protocol::Op::kHealth);
  EXPECT_EQ(protocol::op_from_name("invalidate"), protocol::Op::kInvalidate);
  EXPECT_FALSE(protocol::op_from_name("Health").has_value());
  EXPECT_FALSE(protocol::op_from_name("").has_value());
  for (auto op : {protocol::Op::kLoad, protocol::Op::kInfer, protocol::Op::kStats, protocol::Op::kInvalidate,
                  protocol::Op::kList, protocol::Op::kHealth, protocol::Op::kCancel}) {
    EXPECT_EQ(protocol::op_from_name(protocol::op_name(op)), op);
  }
  EXPECT_EQ(protocol::known_ops_text(), "load, infer, stats, metrics, invalidate, list, health, cancel");
  // Codes a runtime or the cache may report pass through; the rest (and unknown ones) become internal.
  for (const char* code : {"bad_request", "not_found", "forbidden", "load_failed", "context_overflow",
                           "cancelled", "shutting_down", "busy", "io_error"}) {
    EXPECT_EQ(protocol::wire_code(code), code);
  }
  for (const char* code :
       {"gguf_truncated", "", "unknown_op", "line_timeout", "output_overflow", "too_many_connections"}) {
    EXPECT_EQ(protocol::wire_code(code), protocol::code::kInternal) << code;
  }
}

TEST(DaemonProtocol, TheErrorCodeTableSpellsEachCodeOnce) {
  std::set<std::string_view> names;
  for (const ErrorCodeInfo& row : kErrorCodes) {
    EXPECT_TRUE(names.insert(row.name).second) << "code " << row.name << " appears twice";
    EXPECT_FALSE(row.meaning.empty()) << row.name;
    for (char c : row.name)
      EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') << row.name;
    EXPECT_EQ(find_error_code(row.name), &row);
  }
  EXPECT_EQ(find_error_code("no_such_code"), nullptr);
  EXPECT_STREQ(protocol::code::kLineTimeout, errc::kLineTimeout) << "the protocol's codes are the table's";
}

/// The codes in docs/protocol.md's "Error codes" table, in order.
std::vector<std::string> documented_wire_codes() {
  std::ifstream in(std::string(CAR_SOURCE_DIR) + "/docs/protocol.md");
  EXPECT_TRUE(in.good()) << "cannot read docs/protocol.md";
  std::vector<std::string> codes;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = line == "## Error codes";
      continue;
    }
    // Rows look like "| `bad_request` | when ... |".
    if (!in_section || line.rfind("| `", 0) != 0) continue;
    const auto end = line.find('`', 3);
    if (end != std::string::npos) codes.push_back(line.substr(3, end - 3));
  }
  return codes;
}

TEST(DaemonProtocol, DocsListTheTablesWireCodes) {
  std::set<std::string> documented;
  for (const std::string& code : documented_wire_codes()) {
    EXPECT_TRUE(documented.insert(code).second) << "docs/protocol.md lists " << code << " twice";
  }
  std::set<std::string> wire;
  for (const ErrorCodeInfo& row : kErrorCodes) {
    if (row.reach != Reach::kLocal) wire.insert(std::string(row.name));
  }
  EXPECT_EQ(documented, wire) << "docs/protocol.md's \"Error codes\" table and the wire rows of "
                                 "core/util/error_codes.h differ";
}

TEST(DaemonProtocol, FramerSaysWhetherALineIsOpen) {
  LineFramer f(4);
  std::vector<LineFramer::Item> out;
  EXPECT_FALSE(f.in_line());
  f.feed("ab", out);
  EXPECT_TRUE(f.in_line());
  f.feed("\n", out);
  EXPECT_FALSE(f.in_line());
  f.feed("123456", out);  // over-long, being discarded: still an open line
  EXPECT_EQ(f.buffered(), 0u);
  EXPECT_TRUE(f.in_line());
  f.feed("\n", out);
  EXPECT_FALSE(f.in_line());
}

TEST(DaemonProtocol, FramerSplitsLinesAcrossChunks) {
  LineFramer f(16);
  std::vector<LineFramer::Item> out;
  f.feed("ab", out);
  f.feed("c\nde\n\nf", out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].line, "abc");
  EXPECT_EQ(out[1].line, "de");
  EXPECT_EQ(out[2].line, "");
  EXPECT_EQ(f.buffered(), 1u);
  f.feed("g\n", out);
  EXPECT_EQ(out.back().line, "fg");
}

TEST(DaemonProtocol, FramerReportsAnOversizedLineOnceAndResynchronizes) {
  LineFramer f(8);
  std::vector<LineFramer::Item> out;
  f.feed("12345678\n", out);  // exactly the limit: fine
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, LineFramer::Item::Kind::kLine);
  out.clear();
  f.feed("1234", out);
  f.feed("56789", out);  // over the limit, no newline yet
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, LineFramer::Item::Kind::kOversized);
  EXPECT_EQ(f.buffered(), 0u);  // nothing of it is kept
  f.feed(std::string(1000, 'z'), out);
  EXPECT_EQ(out.size(), 1u);
  f.feed("zz\nok\n", out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].line, "ok");
  out.clear();
  f.feed("123456789\nnext\n", out);  // oversized and complete in one chunk
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, LineFramer::Item::Kind::kOversized);
  EXPECT_EQ(out[1].line, "next");
}

}  // namespace
}  // namespace car
