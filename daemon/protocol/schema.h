// The request schema: which fields each op knows (strict checking, with did-you-mean suggestions), the
// readers of the fields several ops share (model, stream_experts, keep_alive), and the `infer` request
// parsed once into InferParams, the typed request the handler and the runtime receive. Pure; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/generate_request.h"
#include "core/util/limits.h"
#include "core/util/result.h"
#include "core/util/stream_experts.h"
#include "daemon/protocol/ops.h"

namespace car::protocol {

/// Strict schema: every member of a request object must be a field its op knows (`id`, `op` and `strict`
/// are known to every op). An unknown member is bad_request naming it, with a suggestion when a known field
/// is close ("unknown field 'tempreature' for op 'infer' (did you mean 'temperature'?)"). A request with
/// `"strict": false` skips the check; `strict` other than a boolean is bad_request.
Result<void> check_fields(Op op, const nlohmann::json& body);
/// The fields `op` knows, besides `id`, `op` and `strict`, in a fixed order (for messages and docs).
const std::vector<std::string_view>& known_fields(Op op);

/// What to generate: the part of an `infer` request the runtime receives, parsed once (parse_infer) and
/// passed to ModelRuntime's Backend::generate as it is. The generation fields are parsed straight into
/// `generate`, the engine's own request: a new field is one parse step here and nothing in between. Unset
/// fields keep the engine's defaults.
struct GenerateParams {
  /// prompt, max_tokens, sampling (temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed),
  /// stop, ignore_eos, logprobs, top_logprobs. `prompt` is empty when `messages` is given (the runtime
  /// renders them into it).
  engine::GenerateRequest generate;
  /// A conversation instead of `prompt` (an array of {role, content, ...} objects): rendered with the model's
  /// chat template, or `chat_template` when given, then tokenized with special-token text parsed.
  std::optional<nlohmann::json> messages;
  bool add_generation_prompt = true;         ///< end the rendered prompt with the assistant's turn opening
  std::optional<std::string> chat_template;  ///< template text used instead of the model's
  /// The request gave `seed`; when false the daemon draws a fresh random one into generate.sampling.seed
  /// (and reports it), so sampled text is reproducible only when asked for.
  bool seed_given = false;
};

/// Upper bound on `top_logprobs` (as OpenAI's API).
inline constexpr int kMaxTopLogprobs = 20;

/// An `infer` request, validated: what to generate plus what the daemon does around it.
struct InferParams : GenerateParams {
  std::string model;
  bool stream = false;
  std::optional<StreamExperts> stream_experts;  ///< the request's choice when it loads the model
};

/// Upper bound on `num_ctx` (the one CAR_INFERENCE_CONTEXT has); the engine bounds num_ctx by the context
/// the model is loaded with.
inline constexpr int kMaxContextLimit = limits::kMaxContextTokens;

/// Upper bound on `max_tokens` (core/util/limits.h).
inline constexpr int kMaxTokensLimit = limits::kMaxGenerateTokens;

/// Read `model` (required string). Error bad_request naming the field.
Result<std::string> model_field(const nlohmann::json& body);
/// Read the optional `stream_experts` field of load / infer: "on", "off" or "auto"; nullopt when absent or
/// null. Error bad_request for anything else.
Result<std::optional<StreamExperts>> stream_experts_field(const nlohmann::json& body);
/// Upper bound on a request's `keep_alive` in seconds (the range of CAR_INFERENCE_MAX_KEEP_ALIVE_SECS); the
/// daemon then cuts it to its CAR_INFERENCE_MAX_KEEP_ALIVE_SECS.
inline constexpr int64_t kMaxKeepAliveSecs = limits::kMaxIdleSecs;
/// Read the optional `keep_alive` field of load / infer: whole seconds the model stays loaded after the
/// request (0: unload it when the request ends); nullopt when absent or null. Error bad_request otherwise.
Result<std::optional<int64_t>> keep_alive_field(const nlohmann::json& body);
/// Read and validate every infer field (types and ranges). Error bad_request naming the field.
Result<InferParams> parse_infer(const nlohmann::json& body);

}  // namespace car::protocol
