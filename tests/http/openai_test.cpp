// The OpenAI API mapping (daemon/http/openai.h): requests to car's typed `infer` request (validated by the
// infer field table's rows as the socket's are), car's typed results to responses, chunks and SSE framing,
// error objects, and the logprobs shapes, from hand-built results.
#include "daemon/http/openai.h"

#include <gtest/gtest.h>

#include "daemon/protocol.h"

namespace car::daemon::http::openai {
namespace {

using nlohmann::json;

/// The typed request a mapping built; fails the test when car's validation refused it.
protocol::InferParams car_request(Mapped& m) {
  auto infer = std::move(m.infer).finish();
  EXPECT_TRUE(infer.ok()) << infer.error().message;
  return infer.ok() ? std::move(*infer) : protocol::InferParams{};
}

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
  const protocol::InferParams infer = car_request(m);
  EXPECT_EQ(infer.model, "tiny");
  EXPECT_EQ(infer.generate.max_tokens, 7);  // max_completion_tokens wins
  ASSERT_TRUE(infer.messages.has_value());
  EXPECT_EQ((*infer.messages)[0], json({{"role", "system"}, {"content", "be brief"}}));
  EXPECT_EQ((*infer.messages)[1], json({{"role", "user"}, {"content", "hello"}}));
  EXPECT_EQ(infer.generate.sampling.temperature, 0.0);
  EXPECT_EQ(infer.generate.sampling.top_p, 0.5);
  EXPECT_EQ(infer.generate.sampling.seed, 42u);
  EXPECT_TRUE(infer.seed_given);
  EXPECT_EQ(infer.generate.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(infer.stream);
  EXPECT_FALSE(infer.generate.logprobs);
}

TEST(OpenAiMapping, CompletionTakesAStringOrOneStringArrayAndDefaultsTo16Tokens) {
  Mapped m = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "Once"}});
  protocol::InferParams infer = car_request(m);
  EXPECT_EQ(infer.generate.prompt, "Once");
  EXPECT_EQ(infer.generate.max_tokens, 16);
  EXPECT_FALSE(infer.stream);
  EXPECT_FALSE(infer.seed_given);
  m = map_ok(Endpoint::kCompletions,
             {{"model", "m"}, {"prompt", {"Once"}}, {"max_tokens", 3}, {"echo", false}});
  infer = car_request(m);
  EXPECT_EQ(infer.generate.prompt, "Once");
  EXPECT_EQ(infer.generate.max_tokens, 3);
}

TEST(OpenAiMapping, LogprobsBecomeCarFields) {
  Mapped c = map_ok(Endpoint::kChat, {{"model", "m"},
                                      {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                      {"logprobs", true},
                                      {"top_logprobs", 3}});
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 3);
  protocol::InferParams ci = car_request(c);
  EXPECT_TRUE(ci.generate.logprobs);
  EXPECT_EQ(ci.generate.top_logprobs, 3);
  Mapped p = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 2}});
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(car_request(p).generate.top_logprobs, 2);
  Mapped z = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"logprobs", 0}});
  protocol::InferParams zi = car_request(z);
  EXPECT_TRUE(zi.generate.logprobs);
  EXPECT_EQ(zi.generate.top_logprobs, 0);
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

TEST(OpenAiMapping, OutOfRangeValuesFailInTheSharedProtocolValidationNamingTheParameter) {
  // car's own rows refuse them as for socket clients; the error object names the parameter.
  for (const auto& [name, value] : std::vector<std::pair<std::string, json>>{{"top_p", 3}, {"top_k", -1}, {"seed", -5}}) {
    json body = {{"model", "m"}, {"prompt", "x"}};
    body[name] = value;
    const ApiError e = map_err(Endpoint::kCompletions, body.dump());
    EXPECT_EQ(e.status, 400) << name;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, name);
    EXPECT_EQ(e.code, "invalid_value");
    EXPECT_NE(e.message.find(name), std::string::npos) << e.message;
  }
  // OpenAI's documented range for temperature is 0..2 (the socket's field goes to 100).
  const ApiError hot = map_err(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":2.5})");
  EXPECT_EQ(hot.param, "temperature");
  EXPECT_EQ(hot.status, 400);
  map_ok(Endpoint::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"temperature", 2}});
}

// One rule on both fronts: an unknown parameter is a 400 naming it and the nearest known one; those OpenAI
// documents that cannot change the result are accepted and ignored.
TEST(OpenAiMapping, UnknownParametersAre400WithTheNearestOne) {
  const ApiError typo =
      map_err(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tempreature":0.1})");
  EXPECT_EQ(typo.status, 400);
  EXPECT_EQ(typo.param, "tempreature");
  EXPECT_EQ(typo.code, "unknown_parameter");
  EXPECT_NE(typo.message.find("did you mean 'temperature'"), std::string::npos) << typo.message;
  // A chat-only parameter on /v1/completions is unknown there.
  EXPECT_EQ(map_err(Endpoint::kCompletions, R"({"model":"m","prompt":"x","messages":[]})").param, "messages");
  EXPECT_EQ(map_err(Endpoint::kCompletions, R"({"model":"m","prompt":"x","min_p":0.1})").param, "min_p");
  map_ok(Endpoint::kChat, {{"model", "m"},
                           {"messages", {{{"role", "user"}, {"content", "x"}}}},
                           {"user", "u-1"},
                           {"metadata", {{"k", "v"}}},
                           {"store", false},
                           {"top_k", 5}});
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
  // `param` names the field an error is about wherever car's error tells it.
  EXPECT_EQ(from_car_error("not_found", "no model").param, "model");
  EXPECT_EQ(from_car_error("forbidden", "../x").param, "model");
  EXPECT_EQ(from_car_error("context_overflow", "long").param, "max_tokens");
  EXPECT_EQ(from_car_error("bad_request", "the model has no chat template (tokenizer.chat_template): x").param,
            "messages");
  EXPECT_EQ(from_car_error("bad_request", "messages: a message has no role").param, "messages");
  EXPECT_EQ(from_car_error("bad_request", "chat template: line 1:2: unknown filter").param, "messages");
  EXPECT_EQ(from_car_error("bad_request", "the chat template rejected the conversation: no").param, "messages");
  EXPECT_EQ(from_car_error("bad_request", "the prompt is empty (no tokens)").param, "prompt");
  EXPECT_EQ(from_car_error("busy", "full").param, "");
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

protocol::InferResult car_result(std::string reason) {
  protocol::InferResult r;
  r.model = "m";
  r.output.text = "Hi there";
  r.output.tokens = {5, 6};
  r.output.finish_reason = std::move(reason);
  r.output.prompt_tokens = 4;
  r.output.cached_tokens = 3;
  return r;
}

TEST(OpenAiResponses, ChatCompletionShape) {
  Mapped m = map_ok(Endpoint::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  json r = json::parse(response(Endpoint::kChat, m, car_result("eos"), "chatcmpl-1", 1700000000));
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
  EXPECT_EQ(r["usage"], json({{"prompt_tokens", 4},
                              {"completion_tokens", 2},
                              {"total_tokens", 6},
                              {"prompt_tokens_details", {{"cached_tokens", 3}}}}));
}

TEST(OpenAiResponses, CompletionShapeAndFinishReasons) {
  Mapped m = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}});
  json r = json::parse(response(Endpoint::kCompletions, m, car_result("length"), "cmpl-1", 1));
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
  json first = json::parse(text_chunk(Endpoint::kChat, m, "c", 1, "", true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  json next = json::parse(text_chunk(Endpoint::kChat, m, "c", 1, "Hi", false));
  EXPECT_EQ(next["choices"][0]["delta"], json({{"content", "Hi"}}));
  json fin = json::parse(finish_chunk(Endpoint::kChat, m, "c", 1, "stop"));
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  protocol::GenerateOutput out;
  out.prompt_tokens = 3;
  out.tokens = {7};
  json u = json::parse(usage_chunk(Endpoint::kChat, m, "c", 1, out));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 4);

  Mapped p = map_ok(Endpoint::kCompletions, {{"model", "m"}, {"prompt", "x"}, {"stream", true}});
  json pc = json::parse(text_chunk(Endpoint::kCompletions, p, "c", 1, "Hi", false));
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
  const std::string ev = sse_event(text_chunk(Endpoint::kCompletions, m, "c", 1, "a\nb", false));
  EXPECT_EQ(ev.find('\n'), ev.size() - 2);
}

// car's per-token logprob entries as the runtime delivers them.
std::vector<protocol::TokenLogprobs> car_logprobs() {
  auto entry = [](int32_t token, std::string text, double logprob, std::vector<protocol::TokenLogprob> top) {
    protocol::TokenLogprobs e;
    e.token = token;
    e.text = std::move(text);
    e.logprob = logprob;
    e.top_logprobs = std::move(top);
    return e;
  };
  return {entry(10, "Hi", -0.25, {{10, "Hi", -0.25}, {11, "Ho", -1.5}, {12, "Ha", -3.0}}),
          entry(13, " \u00e9", -0.5, {{13, " \u00e9", -0.5}})};
}

/// The `logprobs` of a response's choice for car_logprobs(), the request asking for `top` alternatives.
json response_logprobs(Endpoint endpoint, int top) {
  Mapped m;
  m.model = "m";
  m.logprobs = true;
  m.top_logprobs = top;
  protocol::InferResult result = car_result("stop");
  result.logprobs = true;
  result.output.logprobs = car_logprobs();
  return json::parse(response(endpoint, m, result, "c", 1))["choices"][0]["logprobs"];
}

TEST(OpenAiLogprobs, ChatShape) {
  json lp = response_logprobs(Endpoint::kChat, 2);
  ASSERT_EQ(lp["content"].size(), 2u);
  EXPECT_TRUE(lp["refusal"].is_null());
  const json& t0 = lp["content"][0];
  EXPECT_EQ(t0["token"], "Hi");
  EXPECT_DOUBLE_EQ(t0["logprob"].get<double>(), -0.25);
  EXPECT_EQ(t0["bytes"], json({72, 105}));
  ASSERT_EQ(t0["top_logprobs"].size(), 2u);  // capped at the request's top_logprobs
  EXPECT_EQ(t0["top_logprobs"][1], json({{"token", "Ho"}, {"logprob", -1.5}, {"bytes", {72, 111}}}));
  EXPECT_EQ(lp["content"][1]["bytes"], json({32, 0xc3, 0xa9}));
  EXPECT_TRUE(response_logprobs(Endpoint::kChat, 0)["content"][0]["top_logprobs"].empty());
}

TEST(OpenAiLogprobs, CompletionShape) {
  json lp = response_logprobs(Endpoint::kCompletions, 3);
  EXPECT_EQ(lp["tokens"], json({"Hi", " \u00e9"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.25, -0.5}));
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{"Hi", -0.25}, {"Ho", -1.5}, {"Ha", -3.0}}));
}

TEST(OpenAiLogprobs, ResponsesAndChunksCarryThemOnlyWhenAsked) {
  protocol::InferResult result = car_result("stop");
  result.logprobs = true;
  result.output.logprobs = car_logprobs();
  Mapped with = map_ok(Endpoint::kChat, {{"model", "m"},
                                         {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                         {"logprobs", true},
                                         {"top_logprobs", 1}});
  json r = json::parse(response(Endpoint::kChat, with, result, "c", 1));
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
  Mapped without =
      map_ok(Endpoint::kChat, {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_TRUE(
      json::parse(response(Endpoint::kChat, without, result, "c", 1))["choices"][0]["logprobs"].is_null());
  // A streamed token's chunk carries its own entry in the same shape.
  const json chunk =
      json::parse(text_chunk(Endpoint::kChat, with, "c", 1, "Hi", false, &result.output.logprobs[0]));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
  EXPECT_TRUE(json::parse(text_chunk(Endpoint::kChat, without, "c", 1, "Hi", false,
                                     &result.output.logprobs[0]))["choices"][0]["logprobs"]
                  .is_null());
}

// The bodies are written without a document, in the order a document dumps its keys: byte for byte what
// the document would be.
TEST(OpenAiResponses, BodiesAreTheBytesOfTheDocuments) {
  Mapped m = map_ok(Endpoint::kChat, {{"model", "m"},
                                      {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                      {"logprobs", true},
                                      {"top_logprobs", 2},
                                      {"stream", true},
                                      {"stream_options", {{"include_usage", true}}}});
  protocol::InferResult result = car_result("eos");
  result.logprobs = true;
  result.output.logprobs = car_logprobs();
  for (Endpoint e : {Endpoint::kChat, Endpoint::kCompletions}) {
    for (const std::string& body :
         {response(e, m, result, "c-1", 5),
          text_chunk(e, m, "c-1", 5, "Hi", true, &result.output.logprobs[1]),
          finish_chunk(e, m, "c-1", 5, "length"), usage_chunk(e, m, "c-1", 5, result.output)}) {
      EXPECT_EQ(body, json::parse(body).dump()) << body;
    }
  }
}

}  // namespace
}  // namespace car::daemon::http::openai
