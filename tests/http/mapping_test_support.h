// What the OpenAI and Ollama mapping tests share: map a body and expect success or an error, and finish
// the typed request car's validation builds. Templates over each API's Mapped; map_request is found by
// argument-dependent lookup in the namespace of the Endpoint given.
#pragma once

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/http/openai.h"
#include "daemon/protocol.h"

namespace car::daemon::http::testing {

/// The typed request a mapping built; fails the test when car's validation refused it.
template <class Mapped>
protocol::InferParams car_request(Mapped& m) {
  auto infer = std::move(m.infer).finish();
  EXPECT_TRUE(infer.ok()) << infer.error().message;
  return infer.ok() ? std::move(*infer) : protocol::InferParams{};
}

template <class Mapped, class Endpoint>
Mapped map_ok(Endpoint e, const nlohmann::json& body) {
  Mapped m;
  auto err = map_request(e, body.dump(), m);
  EXPECT_FALSE(err.has_value()) << (err ? err->message : "");
  return m;
}

template <class Mapped, class Endpoint>
openai::ApiError map_err(Endpoint e, const std::string& body) {
  Mapped m;
  auto err = map_request(e, body, m);
  EXPECT_TRUE(err.has_value()) << body;
  return err.value_or(openai::ApiError{});
}

}  // namespace car::daemon::http::testing
