// Reply lines (daemon/protocol/reply_lines.h) and the client's reply parser (reply_parser.h): token events
// with and without logprobs, and lines byte for byte what a document would dump.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "daemon/protocol.h"

namespace car {
namespace {

using nlohmann::json;

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
