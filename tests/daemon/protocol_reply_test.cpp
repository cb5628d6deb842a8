// Reply lines (daemon/protocol/reply_lines.h) and the client's reply parser (reply_parser.h): token events
// with and without logprobs, and lines byte for byte what a document would dump.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "daemon/protocol.h"

namespace car {
namespace {

using nlohmann::json;

protocol::TokenLogprobs sample_logprobs() {
  protocol::TokenLogprobs lp;
  lp.token = 7;
  lp.text = " a";
  lp.logprob = -0.25;
  lp.top_logprobs = {{7, " a", -0.25}, {9, " b", -1.5}};
  return lp;
}

const char* const kSampleEntry =
    R"({"token":7,"text":" a","logprob":-0.25,"top_logprobs":[{"token":7,"text":" a","logprob":-0.25},{"token":9,"text":" b","logprob":-1.5}]})";

TEST(DaemonProtocol, TokenEventsAndResultsCarryLogprobs) {
  const protocol::TokenLogprobs lp = sample_logprobs();
  const json entry = json::parse(kSampleEntry);
  const std::string with_line = protocol::token_line(3, protocol::TokenEvent{7, " a", lp});
  const json with = json::parse(with_line);
  EXPECT_EQ(with["logprob"], -0.25);
  EXPECT_EQ(with["top_logprobs"], entry["top_logprobs"]);
  EXPECT_EQ(with["text"], " a");
  EXPECT_EQ(with_line, protocol::dump(with));  // the bytes a document dumps
  const json without = json::parse(protocol::token_line(3, protocol::TokenEvent{7, " a", std::nullopt}));
  EXPECT_FALSE(without.contains("logprob"));
  EXPECT_FALSE(without.contains("top_logprobs"));

  protocol::InferResult r;
  r.logprobs = true;
  r.output.tokens = {7};
  r.output.logprobs = {lp};
  EXPECT_EQ(json::parse(protocol::infer_line(1, r))["result"]["logprobs"], json::array({entry}));
}

// The infer result line is written from the typed result: byte for byte the line the result as a document
// made (docs/protocol.md's `infer` result), with and without its optional members.
TEST(DaemonProtocol, InferLinesAreTheSerializedResultDocuments) {
  protocol::InferResult r;
  r.model = "tiny";
  r.output.text = " there was\xff";  // invalid UTF-8 is replaced, as dump() does
  r.output.tokens = {727, 471};
  r.output.finish_reason = "length";
  r.output.prompt_tokens = 5;
  r.output.cached_tokens = 2;
  r.output.prompt_ms = 3.25;
  r.output.decode_ms = 0.0;
  r.seed = 4183011652u;
  r.load_ms = 0.5;
  r.queue_ms = 0.125;
  r.ttft_ms = 3.5;
  auto document = [](const protocol::InferResult& result) {
    json d = {{"model", result.model},
              {"text", result.output.text},
              {"tokens", result.output.tokens},
              {"finish_reason", result.output.finish_reason},
              {"seed", result.seed},
              {"usage",
               {{"prompt_tokens", result.output.prompt_tokens},
                {"cached_tokens", result.output.cached_tokens},
                {"completion_tokens", result.output.tokens.size()}}},
              {"timings",
               {{"load_ms", result.load_ms},
                {"queue_ms", result.queue_ms},
                {"prompt_ms", result.output.prompt_ms},
                {"decode_ms", result.output.decode_ms},
                {"ttft_ms", result.ttft_ms}}}};
    if (!result.output.chat_template.empty()) d["chat_template"] = result.output.chat_template;
    if (result.keep_alive_given)
      d["keep_alive_s"] = result.keep_alive_s ? json(*result.keep_alive_s) : json(nullptr);
    if (result.logprobs) {
      json lps = json::array();
      for (const auto& lp : result.output.logprobs) {
        json top = json::array();
        for (const auto& t : lp.top_logprobs)
          top.push_back({{"token", t.token}, {"text", t.text}, {"logprob", t.logprob}});
        lps.push_back(
            {{"token", lp.token}, {"text", lp.text}, {"logprob", lp.logprob}, {"top_logprobs", top}});
      }
      d["logprobs"] = std::move(lps);
    }
    return d;
  };
  EXPECT_EQ(protocol::infer_line("a", r), protocol::ok_line("a", document(r)));
  r.output.chat_template = "model";
  r.keep_alive_given = true;  // pinned: null
  EXPECT_EQ(protocol::infer_line(7, r), protocol::ok_line(7, document(r)));
  r.keep_alive_s = 300;
  r.logprobs = true;  // asked for, none generated: an empty array
  r.output.tokens.clear();
  EXPECT_EQ(protocol::infer_line(7, r), protocol::ok_line(7, document(r)));
  r.output.tokens = {7, 7};
  r.output.logprobs = {sample_logprobs(), sample_logprobs()};
  EXPECT_EQ(protocol::infer_line(nullptr, r), protocol::ok_line(nullptr, document(r)));
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

}  // namespace
}  // namespace car
