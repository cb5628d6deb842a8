// The Ollama API mapping (daemon/http/ollama.h): requests to car's typed `infer` request (validated by the
// infer field table's rows), `options` and `keep_alive`, what is refused and why, and the response lines and
// listings built from hand-made results. The real `ollama` client drives the front in tests/http/node.
#include "daemon/http/ollama.h"

#include <gtest/gtest.h>

#include "core/util/limits.h"
#include "daemon/protocol.h"

namespace car::daemon::http::ollama {
namespace {

using nlohmann::json;

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

openai::ApiError map_err(Endpoint e, const std::string& body) {
  Mapped m;
  auto err = map_request(e, body, m);
  EXPECT_TRUE(err.has_value()) << body;
  return err.value_or(openai::ApiError{});
}

TEST(OllamaMapping, GenerateRendersThePromptAsAUserTurnUnlessRaw) {
  Mapped m = map_ok(Endpoint::kGenerate, {{"model", "tiny:latest"}, {"prompt", "Hi"}, {"system", "Be brief."}});
  EXPECT_EQ(m.model, "tiny");
  EXPECT_TRUE(m.stream) << "Ollama streams unless told not to";
  EXPECT_TRUE(m.raw_without_template);
  EXPECT_EQ(m.raw_prompt, "Hi");
  EXPECT_TRUE(m.to_context) << "no num_predict: until the context is full";
  protocol::InferParams p = car_request(m);
  EXPECT_EQ(p.model, "tiny");
  EXPECT_TRUE(p.stream);
  ASSERT_TRUE(p.messages.has_value());
  EXPECT_EQ(*p.messages, json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])"));

  Mapped raw = map_ok(Endpoint::kGenerate, {{"model", "tiny"}, {"prompt", "Hi"}, {"raw", true}, {"stream", false}});
  EXPECT_FALSE(raw.raw_without_template);
  protocol::InferParams rp = car_request(raw);
  EXPECT_FALSE(rp.messages.has_value());
  EXPECT_EQ(rp.generate.prompt, "Hi");
  EXPECT_FALSE(rp.stream);
  EXPECT_NE(map_err(Endpoint::kGenerate, R"({"model":"t","prompt":"x","raw":true,"system":"s"})").message.find("raw"),
            std::string::npos);
}

TEST(OllamaMapping, OptionsMapOntoCarsFieldsAndAreCheckedByItsRows) {
  Mapped m = map_ok(Endpoint::kChat, {{"model", "tiny"},
                                      {"messages", {{{"role", "user"}, {"content", "hello"}}}},
                                      {"options",
                                       {{"temperature", 0.5},
                                        {"top_k", 7},
                                        {"top_p", 0.9},
                                        {"min_p", 0.05},
                                        {"seed", 42},
                                        {"stop", {"\n\n"}},
                                        {"num_predict", 12},
                                        {"repeat_penalty", 1.1},
                                        {"repeat_last_n", -1},
                                        {"num_ctx", 256},
                                        {"num_thread", 8},
                                        {"mirostat", 0},
                                        {"typical_p", 1.0}}}});
  EXPECT_FALSE(m.to_context);
  protocol::InferParams p = car_request(m);
  EXPECT_FLOAT_EQ(p.generate.sampling.temperature, 0.5f);
  EXPECT_EQ(p.generate.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(p.generate.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(p.generate.sampling.min_p, 0.05f);
  EXPECT_EQ(p.generate.sampling.seed, 42u);
  EXPECT_TRUE(p.seed_given);
  EXPECT_EQ(p.generate.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(p.generate.max_tokens, 12);
  EXPECT_FLOAT_EQ(p.generate.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(p.generate.sampling.repeat_last_n, 16 * limits::kMaxGenerateTokens) << "-1: the whole context";
  EXPECT_EQ(p.generate.num_ctx, 256);
  ASSERT_TRUE(p.messages.has_value());
  EXPECT_EQ((*p.messages)[0]["content"], "hello");

  Mapped unbounded = map_ok(Endpoint::kGenerate, {{"model", "t"}, {"prompt", "x"}, {"options", {{"num_predict", -1}}}});
  EXPECT_TRUE(unbounded.to_context);
  // A value car's row refuses names the option.
  const auto e = map_err(Endpoint::kGenerate, R"({"model":"t","prompt":"x","options":{"top_p":3}})");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("top_p"), std::string::npos) << e.message;
}

TEST(OllamaMapping, UnknownFieldsAndOptionsAreErrorsWithTheNearestName) {
  auto e = map_err(Endpoint::kGenerate, R"({"model":"t","prompt":"x","options":{"tempreature":1}})");
  EXPECT_EQ(e.message, "unknown option \"tempreature\" (did you mean 'temperature'?)");
  e = map_err(Endpoint::kChat, R"({"model":"t","mesages":[]})");
  EXPECT_EQ(e.message, "unknown field \"mesages\" (did you mean 'messages'?)");
  e = map_err(Endpoint::kChat, R"({"model":"t","messages":[{"role":"user","contnet":"x"}]})");
  EXPECT_NE(e.message.find("did you mean 'content'"), std::string::npos) << e.message;
}

TEST(OllamaMapping, WhatCarCannotDoIsRefusedNotIgnored) {
  for (const char* body : {
           R"({"model":"t","prompt":"x","format":"json"})",
           R"({"model":"t","prompt":"x","format":{"type":"object"}})",
           R"({"model":"t","prompt":"x","images":["aGk="]})",
           R"({"model":"t","prompt":"x","suffix":"end"})",
           R"({"model":"t","prompt":"x","template":"{{ .Prompt }}"})",
           R"({"model":"t","prompt":"x","context":[1,2,3]})",
           R"({"model":"t","prompt":"x","think":true})",
           R"({"model":"t","prompt":"x","options":{"mirostat":2}})",
           R"({"model":"t","prompt":"x","options":{"presence_penalty":0.5}})",
           R"({"model":"t","prompt":"x","options":{"typical_p":0.7}})",
       }) {
    const auto e = map_err(Endpoint::kGenerate, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(e.message.find("not supported"), std::string::npos) << body << ": " << e.message;
  }
  EXPECT_NE(map_err(Endpoint::kChat, R"({"model":"t","messages":[{"role":"user","content":"x","images":["aGk="]}]})")
                .message.find("vision"),
            std::string::npos);
  EXPECT_NE(map_err(Endpoint::kChat, R"({"model":"t","messages":[],"tools":[{"type":"function"}]})").message.find("tool"),
            std::string::npos);
  // Empty values ask for nothing: accepted, as Ollama's clients send some that way.
  map_ok(Endpoint::kGenerate, {{"model", "t"}, {"prompt", "x"}, {"format", ""}, {"images", json::array()},
                               {"context", json::array()}, {"think", false}});
}

TEST(OllamaMapping, NoPromptLoadsAndKeepAliveZeroUnloads) {
  Mapped load = map_ok(Endpoint::kGenerate, {{"model", "t"}, {"keep_alive", "10m"}});
  EXPECT_TRUE(load.load_only);
  EXPECT_FALSE(load.unload);
  EXPECT_EQ(load.keep_alive_s, 600);
  Mapped unload = map_ok(Endpoint::kChat, {{"model", "t"}, {"messages", json::array()}, {"keep_alive", 0}});
  EXPECT_TRUE(unload.load_only);
  EXPECT_TRUE(unload.unload);
  Mapped with = map_ok(Endpoint::kGenerate, {{"model", "t"}, {"prompt", "x"}, {"keep_alive", "1h"}});
  EXPECT_FALSE(with.load_only);
  EXPECT_EQ(car_request(with).keep_alive, std::chrono::seconds(3600));
}

TEST(OllamaKeepAlive, GoDurationsAndSecondsAsOllamaReadsThem) {
  auto secs = [](const json& v) {
    std::string error;
    auto s = keep_alive_seconds(v, error);
    EXPECT_TRUE(s.has_value()) << v.dump() << ": " << error;
    return s.value_or(-2);
  };
  EXPECT_EQ(secs("5m"), 300);
  EXPECT_EQ(secs("1h30m"), 5400);
  EXPECT_EQ(secs("90s"), 90);
  EXPECT_EQ(secs("1.5h"), 5400);
  EXPECT_EQ(secs("300ms"), 1) << "rounded up: a model kept for less than asked would surprise";
  EXPECT_EQ(secs("0"), 0);
  EXPECT_EQ(secs("0s"), 0);
  EXPECT_EQ(secs("300"), 300) << "a bare number is seconds";
  EXPECT_EQ(secs(300), 300);
  EXPECT_EQ(secs(0), 0);
  EXPECT_EQ(secs("-1"), limits::kMaxIdleSecs) << "negative: for ever (the daemon then cuts it)";
  EXPECT_EQ(secs("-1m"), limits::kMaxIdleSecs);
  EXPECT_EQ(secs(-1), limits::kMaxIdleSecs);
  EXPECT_EQ(secs("100000000h"), limits::kMaxIdleSecs);
  for (const json& bad : {json("5 minutes"), json("m"), json(""), json("5x"), json("1h-3m"), json(true),
                          json::array()}) {
    std::string error;
    EXPECT_FALSE(keep_alive_seconds(bad, error).has_value()) << bad.dump();
    EXPECT_NE(error.find("keep_alive"), std::string::npos);
  }
  EXPECT_NE(map_err(Endpoint::kGenerate, R"({"model":"t","keep_alive":"soon"})").message.find("soon"),
            std::string::npos);
}

TEST(OllamaResponses, StreamLinesAndTheFinalObject) {
  const std::string at = rfc3339(int64_t{1764915121} * 1'000'000'000 + 5);
  EXPECT_EQ(at, "2025-12-05T06:12:01.000000005Z");
  json line = json::parse(text_line(Endpoint::kGenerate, "tiny", at, "Hel"));
  EXPECT_EQ(line, json::parse(R"({"model":"tiny","created_at":"2025-12-05T06:12:01.000000005Z","response":"Hel","done":false})"));
  line = json::parse(text_line(Endpoint::kChat, "tiny", at, "lo"));
  EXPECT_EQ(line["message"], json::parse(R"({"role":"assistant","content":"lo"})"));
  EXPECT_EQ(text_line(Endpoint::kChat, "tiny", at, "x").back(), '\n');

  protocol::InferResult r;
  r.model = "tiny";
  r.load_ms = 2;
  r.queue_ms = 1;
  r.output.prompt_tokens = 7;
  r.output.tokens = {1, 2, 3};
  r.output.prompt_ms = 3;
  r.output.decode_ms = 4.5;
  r.output.finish_reason = "eos";
  json fin = json::parse(final_object(Endpoint::kChat, "tiny", at, r, "abc", false));
  EXPECT_EQ(fin["done"], true);
  EXPECT_EQ(fin["done_reason"], "stop");
  EXPECT_EQ(fin["message"]["content"], "abc");
  EXPECT_EQ(fin["prompt_eval_count"], 7);
  EXPECT_EQ(fin["eval_count"], 3);
  EXPECT_EQ(fin["load_duration"], 2'000'000);
  EXPECT_EQ(fin["prompt_eval_duration"], 3'000'000);
  EXPECT_EQ(fin["eval_duration"], 4'500'000);
  EXPECT_EQ(fin["total_duration"], 10'500'000);
  r.output.finish_reason = "length";
  EXPECT_EQ(json::parse(final_object(Endpoint::kGenerate, "tiny", at, r, "", false))["done_reason"], "length");
  EXPECT_EQ(json::parse(load_object(Endpoint::kGenerate, "tiny", at, true))["done_reason"], "unload");
  openai::ApiError gone;
  gone.status = 404;
  gone.message = "gone";
  EXPECT_EQ(ollama::error_body(gone), json::parse(R"({"error":"gone"})"));
}

TEST(OllamaListings, DetailsDigestAndExpiry) {
  ModelFacts f;
  f.id = "tiny";
  f.file_bytes = 1234;
  f.modified_unix_ns = 42;
  gguf::ModelInfo info;
  info.architecture = "qwen3";
  info.parameters = 6'740'000'000;
  info.quantization = "Q4_K_M";
  f.info = info;
  const json t = tags_entry(f);
  EXPECT_EQ(t["name"], "tiny");
  EXPECT_EQ(t["size"], 1234);
  EXPECT_EQ(t["details"]["family"], "qwen3");
  EXPECT_EQ(t["details"]["parameter_size"], "6.74B");
  EXPECT_EQ(t["details"]["quantization_level"], "Q4_K_M");
  EXPECT_EQ(t["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(digest(f), t["digest"]) << "stable for one file version";
  ModelFacts newer = f;
  newer.modified_unix_ns = 43;
  EXPECT_NE(digest(newer), digest(f)) << "a replaced file is another version";
  const json ps = ps_entry(f, 999, int64_t{1764915121} * 1'000'000'000);
  EXPECT_EQ(ps["size"], 999);
  EXPECT_EQ(ps["expires_at"], "2025-12-05T06:12:01.000000000Z");
  EXPECT_EQ(ps_entry(f, 1, std::nullopt)["expires_at"], "2100-01-01T00:00:00.000000000Z");
  EXPECT_EQ(model_id("a:latest"), "a");
  EXPECT_EQ(model_id("a:q4"), "a:q4");
  EXPECT_EQ(model_id(":latest"), ":latest");
}

}  // namespace
}  // namespace car::daemon::http::ollama
