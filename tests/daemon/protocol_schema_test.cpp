// The request schema (daemon/protocol/schema.h): infer fields parsed into the engine's request with their
// types and ranges checked, strict unknown-field checking, keep_alive, and chat messages.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "daemon/protocol.h"

namespace car {
namespace {

using nlohmann::json;

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
  EXPECT_FALSE(protocol::keep_alive_field(json{{"keep_alive", limits::kMaxIdleSecs + 1}}).ok());
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

}  // namespace
}  // namespace car
