// The OpenAI API mapping (daemon/http/openai.h): requests to car `infer` requests (which must then pass the
// socket protocol's own validation), car results to responses, chunks and SSE framing, error objects, and
// the logprobs shapes, from hand-built car results.
#include "daemon/http/openai.h"

#include <gtest/gtest.h>

#include "daemon/protocol.h"

namespace car::daemon::http::openai {
namespace {

using nlohmann::json;

Mapped map_ok(Endpoint e, const json& body) {
  Mapped m;
  auto err = map_request(e, body.dump(), m);
  EXPECT_FALSE(err.has_value()) << (err ? err->message : "");
  return m;
}

ApiError map_err(Endpoint e, const std::string& body) {
  Mapped m;
  auto err = map_request(e, body, m);
  EXPECT_TRUE(err.has_value()) << body;
  return err.value_or(ApiError{});
}

TEST(OpenAiMapping, ChatBecomesAnInferWithMessagesThatTheProtocolAccepts) {
  const json body = {
      {"model", "tiny"},
      {"messages",
       {{{"role", "developer"}, {"content", "be brief"}},
        {{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "hel"}}, {{"type", "text"}, {"text", "lo"}}}}}}},
      {"max_completion_tokens", 7},
      {"max_tokens", 99},
      {"temperature", 0},
      {"top_p", 0.5},
      {"seed", 42},
      {"stop", {"\n", "END"}},
      {"user", "someone"},
      {"n", 1},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}}};
  Mapped m = map_ok(Endpoint::kChat, body);
  EXPECT_EQ(m.model, "tiny");
  EXPECT_TRUE(m.stream);
  EXPECT_TRUE(m.include_usage);
  EXPECT_EQ(m.car["op"], "infer");
  EXPECT_EQ(m.car["max_tokens"], 7);  // max_completion_tokens wins
  EXPECT_EQ(m.car["messages"][0], json({{"role", "system"}, {"content", "be brief"}}));
  EXPECT_EQ(m.car["messages"][1], json({{"role", "user"}, {"content", "hello"}}));
  EXPECT_FALSE(m.car.contains("user"));
  EXPECT_FALSE(m.car.contains("n"));
  EXPECT_FALSE(m.car.contains("logprobs"));

  json id;
  auto req = protocol::parse_request(protocol::dump(m.car), &id);
  ASSERT_TRUE(req.ok());
  auto infer = protocol::parse_infer(req->body);
  ASSERT_TRUE(infer.ok()) << infer.error().message;
  EXPECT_EQ(infer->generate.max_tokens, 7);
  EXPECT_EQ(infer->generate.sampling.temperature, 0.0);
  EXPECT_EQ(infer->generate.sampling.top_p, 0.5);
  EXPECT_EQ(infer->generate.sampling.seed, 42u);
  EXPECT_EQ(infer->generate.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(infer->stream);
  ASSERT_TRUE(infer->messages.has_value());
}

TEST(OpenAiMapping, CompletionTakesAStringOrOneStringArrayAndDefaultsTo16Tokens) {
  Mapped m = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "Once"}});
  EXPECT_EQ(m.car["prompt"], "Once");
  EXPECT_EQ(m.car["max_tokens"], 16);
  EXPECT_FALSE(m.car.contains("stream"));
  m = map_ok(Endpoint::kCompletions,
             {{"model", "m"}, {"prompt", {"Once"}}, {"max_tokens", 3}, {"echo", false}});
  EXPECT_EQ(m.car["prompt"], "Once");
  EXPECT_EQ(m.car["max_tokens"], 3);
}

TEST(OpenAiMapping, LogprobsBecomeCarFields) {
  Mapped c = map_ok(Endpoint::kChat, {{"model", "m"},
                                      {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                      {"logprobs", true},
                                      {"top_logprobs", 3}});
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 3);
  EXPECT_EQ(c.car["logprobs"], true);
  EXPECT_EQ(c.car["top_logprobs"], 3);
  Mapped p = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 2}});
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.car["top_logprobs"], 2);
  Mapped z = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 0}});
  EXPECT_EQ(z.car["logprobs"], true);
  EXPECT_FALSE(z.car.contains("top_logprobs"));
}

TEST(OpenAiMapping, ResultChangingParametersCarCannotHonourAre400WithTheParamNamed) {
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  struct Case {
    Endpoint e;
    std::string body;
    std::string param;
  } cases[] = {
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"n":2})", "n"},
      {Endpoint::kChat,
       R"({"model":"m",)" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f"}}]})", "tools"},
      {Endpoint::kChat,
       R"({"model":"m",)" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})",
       "response_format"},
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"response_format":{"type":"json_object"}})",
       "response_format"},
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"presence_penalty":0.5})", "presence_penalty"},
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"logit_bias":{"50256":-100}})", "logit_bias"},
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"top_logprobs":2})", "top_logprobs"},
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content"},
      {Endpoint::kChat, R"({"model":"m","messages":[]})", "messages"},
      {Endpoint::kChat, R"({"model":"m",)" + msgs + R"(,"stream_options":{"include_usage":true}})",
       "stream_options"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":"x","echo":true})", "echo"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":"x","best_of":3})", "best_of"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":"x","suffix":"y"})", "suffix"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":["a","b"]})", "prompt"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":[1,2,3]})", "prompt"},
      {Endpoint::kCompletions, R"({"model":"m","prompt":"x","logprobs":6})", "logprobs"},
      {Endpoint::kCompletions, R"({"prompt":"x"})", "model"},
      {Endpoint::kCompletions, R"({"model":3,"prompt":"x"})", "model"},
  };
  for (const auto& c : cases) {
    ApiError e = map_err(c.e, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_EQ(map_err(Endpoint::kChat, "{not json").status, 400);
  EXPECT_EQ(map_err(Endpoint::kChat, "[1]").status, 400);
}

TEST(OpenAiMapping, NeutralValuesOfUnsupportedParametersAreAccepted) {
  map_ok(Endpoint::kChat, {{"model", "m"},
                           {"messages", {{{"role", "user"}, {"content", "x"}}}},
                           {"presence_penalty", 0},
                           {"frequency_penalty", 0.0},
                           {"logit_bias", json::object()},
                           {"tools", json::array()},
                           {"tool_choice", "none"},
                           {"response_format", {{"type", "text"}}}});
}

TEST(OpenAiMapping, OutOfRangeValuesFailInTheSharedProtocolValidation) {
  // The mapping passes them on; protocol::parse_infer (the handler) rejects them as for socket clients.
  Mapped m = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"top_p", 3}});
  auto infer = protocol::parse_infer(m.car);
  ASSERT_FALSE(infer.ok());
  EXPECT_NE(infer.error().message.find("top_p"), std::string::npos);
  ApiError e = from_car_error(infer.error().code, infer.error().message);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
}

// As on the socket (issue #23): a body nesting deeper than the protocol's limit is refused unparsed.
TEST(OpenAiMapping, DeeplyNestedBodiesAre400) {
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  const ApiError e =
      map_err(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":)" + deep + "}]}");
  EXPECT_NE(e.message.find("nests deeper than 128"), std::string::npos) << e.message;
}

TEST(OpenAiErrors, CarCodesMapToStatuses) {
  EXPECT_EQ(from_car_error("not_found", "no model").status, 404);
  EXPECT_EQ(from_car_error("not_found", "no model").code, "model_not_found");
  EXPECT_EQ(from_car_error("busy", "full").status, 429);
  EXPECT_EQ(from_car_error("busy", "full").type, "rate_limit_error");
  EXPECT_EQ(from_car_error("shutting_down", "bye").status, 503);
  EXPECT_EQ(from_car_error("context_overflow", "long").status, 400);
  EXPECT_EQ(from_car_error("context_overflow", "long").code, "context_length_exceeded");
  EXPECT_EQ(from_car_error("forbidden", "../x").status, 400);
  EXPECT_EQ(from_car_error("load_failed", "bad file").status, 500);
  EXPECT_EQ(from_car_error("internal", "oops").status, 500);
}

TEST(OpenAiErrors, ErrorBodyHasOpenAisFourFieldsWithNulls) {
  json b = error_body(ApiError{400, "bad n", "invalid_request_error", "n", ""});
  EXPECT_EQ(
      b,
      json::parse(R"({"error":{"message":"bad n","type":"invalid_request_error","param":"n","code":null}})"));
  json c = error_body(ApiError{404, "gone", "invalid_request_error", "", "model_not_found"});
  EXPECT_TRUE(c["error"]["param"].is_null());
  EXPECT_EQ(c["error"]["code"], "model_not_found");
}

json car_result(std::string reason) {
  return {{"model", "m"},
          {"text", "Hi there"},
          {"tokens", {5, 6}},
          {"finish_reason", std::move(reason)},
          {"usage", {{"prompt_tokens", 4}, {"completion_tokens", 2}}}};
}

TEST(OpenAiResponses, ChatCompletionShape) {
  Mapped m = map_ok(Endpoint::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  json r = response(Endpoint::kChat, m, car_result("eos"), "chatcmpl-1", 1700000000);
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "m");
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hi there");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");  // car's eos
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"], json({{"prompt_tokens", 4}, {"completion_tokens", 2}, {"total_tokens", 6}}));
}

TEST(OpenAiResponses, CompletionShapeAndFinishReasons) {
  Mapped m = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}});
  json r = response(Endpoint::kCompletions, m, car_result("length"), "cmpl-1", 1);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "Hi there");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(finish_reason("stop"), "stop");
  EXPECT_EQ(finish_reason("eos"), "stop");
  EXPECT_EQ(finish_reason("length"), "length");
}

TEST(OpenAiResponses, ChunksCarryTheRoleFirstThenDeltasThenTheFinishAndUsage) {
  Mapped m = map_ok(Endpoint::kChat, {{"model", "m"},
                                      {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                      {"stream", true},
                                      {"stream_options", {{"include_usage", true}}}});
  json first = text_chunk(Endpoint::kChat, m, "c", 1, "", true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  json next = text_chunk(Endpoint::kChat, m, "c", 1, "Hi", false);
  EXPECT_EQ(next["choices"][0]["delta"], json({{"content", "Hi"}}));
  json fin = finish_chunk(Endpoint::kChat, m, "c", 1, "stop");
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  json u = usage_chunk(Endpoint::kChat, m, "c", 1, {{"prompt_tokens", 3}, {"completion_tokens", 1}});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 4);

  Mapped p = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"stream", true}});
  json pc = text_chunk(Endpoint::kCompletions, p, "c", 1, "Hi", false);
  EXPECT_EQ(pc["object"], "text_completion");
  EXPECT_EQ(pc["choices"][0]["text"], "Hi");
  EXPECT_FALSE(pc.contains("usage"));  // only with include_usage
}

TEST(OpenAiSse, EventsAreDataLinesEndedByABlankLine) {
  EXPECT_EQ(sse_event(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event("x\ny"), "data: x\ndata: y\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // A chunk with a newline in its text is still one line of JSON (escaped).
  Mapped m = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}});
  const std::string ev =
      sse_event(protocol::dump(text_chunk(Endpoint::kCompletions, m, "c", 1, "a\nb", false)));
  EXPECT_EQ(ev.find('\n'), ev.size() - 2);
}

// car's final-result logprobs as the other side of the seam defines them.
json car_logprobs() {
  return json::parse(R"([
    {"token": 10, "text": "Hi", "logprob": -0.25,
     "top_logprobs": [{"token": 10, "text": "Hi", "logprob": -0.25}, {"token": 11, "text": "Ho", "logprob": -1.5},
                      {"token": 12, "text": "Ha", "logprob": -3.0}]},
    {"token": 13, "text": " \u00e9", "logprob": -0.5,
     "top_logprobs": [{"token": 13, "text": " \u00e9", "logprob": -0.5}]}
  ])");
}

TEST(OpenAiLogprobs, ChatShape) {
  json lp = chat_logprobs(car_logprobs(), 2);
  ASSERT_EQ(lp["content"].size(), 2u);
  EXPECT_TRUE(lp["refusal"].is_null());
  const json& t0 = lp["content"][0];
  EXPECT_EQ(t0["token"], "Hi");
  EXPECT_DOUBLE_EQ(t0["logprob"].get<double>(), -0.25);
  EXPECT_EQ(t0["bytes"], json({72, 105}));
  ASSERT_EQ(t0["top_logprobs"].size(), 2u);  // capped at the request's top_logprobs
  EXPECT_EQ(t0["top_logprobs"][1], json({{"token", "Ho"}, {"logprob", -1.5}, {"bytes", {72, 111}}}));
  EXPECT_EQ(lp["content"][1]["bytes"], json({32, 0xc3, 0xa9}));
  EXPECT_TRUE(chat_logprobs(car_logprobs(), 0)["content"][0]["top_logprobs"].empty());
}

TEST(OpenAiLogprobs, CompletionShape) {
  json lp = completion_logprobs(car_logprobs(), 3);
  EXPECT_EQ(lp["tokens"], json({"Hi", " \u00e9"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.25, -0.5}));
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{"Hi", -0.25}, {"Ho", -1.5}, {"Ha", -3.0}}));
}

TEST(OpenAiLogprobs, ResponsesCarryThemOnlyWhenAsked) {
  json result = car_result("stop");
  result["logprobs"] = car_logprobs();
  Mapped with = map_ok(Endpoint::kChat, {{"model", "m"},
                                         {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                         {"logprobs", true},
                                         {"top_logprobs", 1}});
  json r = response(Endpoint::kChat, with, result, "c", 1);
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
  Mapped without =
      map_ok(Endpoint::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_TRUE(response(Endpoint::kChat, without, result, "c", 1)["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace car::daemon::http::openai
