// The request schema: which fields each op knows (strict checking, with did-you-mean suggestions), the
// readers of the fields several ops share (model, stream_experts, keep_alive), and the `infer` request,
// parsed once into InferParams - the typed request both fronts hand the handler and the runtime receives.
//
// The infer fields are one table (CAR_INFER_FIELDS): name, JSON type, range and the InferParams member
// each sets. It drives the known-field list, parse_infer, the HTTP front's OpenAI mapping (InferBuilder,
// the `openai` column) and the test that checks docs/protocol.md's list against it. Pure; any thread.
#pragma once

#include <bitset>
#include <chrono>
#include <cstddef>
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

/// What to generate: the part of an `infer` request the runtime receives, parsed once (parse_infer or the
/// HTTP front's InferBuilder) and passed to ModelRuntime's Backend::generate as it is. The generation
/// fields are parsed straight into `generate`, the engine's own request. Unset fields keep the engine's
/// defaults.
struct GenerateParams {
  /// prompt, max_tokens, sampling (temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed),
  /// stop, ignore_eos, logprobs, top_logprobs, num_ctx. `prompt` is empty when `messages` is given (the
  /// runtime renders them into it).
  engine::GenerateRequest generate;
  /// A conversation instead of `prompt` (an array of {role, content, ...} objects): rendered with the model's
  /// chat template, or `chat_template` when given, then tokenized with special-token text parsed.
  std::optional<nlohmann::json> messages;
  bool add_generation_prompt = true;         ///< end the rendered prompt with the assistant's turn opening
  std::optional<std::string> chat_template;  ///< template text used instead of the model's
  /// The request gave `seed`; when false the daemon draws a fresh random one into generate.sampling.seed
  /// (and reports it), so sampled text is reproducible only when asked for.
  bool seed_given = false;
  // Set by a front after parsing; never wire fields.
  /// With `messages`: when the model has no chat template (and none was given), generate.prompt is used as
  /// it is instead of failing (Ollama's /api/generate treats a template-less model's prompt as raw text).
  bool raw_without_template = false;
  /// How this front's client gives a chat template, ending the message of a request refused for having none
  /// ("give one in the request's `chat_template` field" on the socket).
  std::string no_template_hint = "give one in the request's \"chat_template\" field";
};

/// An `infer` request, validated: what to generate plus what the daemon does around it.
struct InferParams : GenerateParams {
  std::string model;
  bool stream = false;
  std::optional<StreamExperts> stream_experts;  ///< the request's choice when it loads the model
  /// How long the model stays loaded after this request (before the daemon's cut to
  /// CAR_INFERENCE_MAX_KEEP_ALIVE_SECS); nullopt: the cache's idle TTL.
  std::optional<std::chrono::seconds> keep_alive;
  /// How long after its arrival the request may run: past it, one not started yet is deadline_exceeded and
  /// one generating ends with finish_reason "deadline" and the text so far. nullopt: no deadline.
  std::optional<std::chrono::milliseconds> deadline;
};

/// An infer field's JSON type, as docs/protocol.md's table names it.
enum class FieldType {
  kString,
  kInteger,
  kNumber,
  kBoolean,
  kStrings,       ///< a string or an array of strings
  kMessages,      ///< an array of {role, content} objects
  kStreamExperts  ///< "on", "off" or "auto"
};

/// How the OpenAI API's parameter of the same name reaches an infer field (daemon/http/openai.h).
enum class OpenAi {
  kSame,    ///< taken as it is, validated by the row like a socket request's field
  kMapped,  ///< the HTTP front converts OpenAI's own parameter(s) into it
  kNone     ///< not an OpenAI parameter: an OpenAI request never sets it
};

// The infer fields, one row each: enumerator, wire name, JSON type, range (integers and numbers; the row
// refuses values outside it), the InferParams member it sets, and how OpenAI's parameter maps. A new field
// is a row here, a line in docs/protocol.md's table (a test compares them) and nothing else; null is absent.
// `seed` takes any integer 0..2^64-1 (its range is not checked as a double); `repeat_penalty` must also be
// > 0 and `top_logprobs` > 0 implies `logprobs` (InferBuilder::finish).
#define CAR_INFER_FIELDS(X)                                                                             \
  X(kModel, "model", kString, 0, 0, model, kSame)                                                       \
  X(kPrompt, "prompt", kString, 0, 0, generate.prompt, kMapped)                                         \
  X(kMessages, "messages", kMessages, 0, 0, messages, kMapped)                                          \
  X(kAddGenerationPrompt, "add_generation_prompt", kBoolean, 0, 0, add_generation_prompt, kNone)        \
  X(kChatTemplate, "chat_template", kString, 0, 0, chat_template, kNone)                                \
  X(kMaxTokens, "max_tokens", kInteger, 0, limits::kMaxGenerateTokens, generate.max_tokens, kMapped)    \
  X(kTemperature, "temperature", kNumber, 0, 100, generate.sampling.temperature, kSame)                 \
  X(kTopK, "top_k", kInteger, 0, INT32_MAX, generate.sampling.top_k, kSame)                             \
  X(kTopP, "top_p", kNumber, 0, 1, generate.sampling.top_p, kSame)                                      \
  X(kSeed, "seed", kInteger, 0, UINT64_MAX, generate.sampling.seed, kSame)                              \
  X(kStop, "stop", kStrings, 0, 0, generate.stop, kSame)                                                \
  X(kStream, "stream", kBoolean, 0, 0, stream, kSame)                                                   \
  X(kIgnoreEos, "ignore_eos", kBoolean, 0, 0, generate.ignore_eos, kNone)                               \
  X(kStreamExperts, "stream_experts", kStreamExperts, 0, 0, stream_experts, kNone)                      \
  X(kMinP, "min_p", kNumber, 0, 1, generate.sampling.min_p, kNone)                                      \
  X(kRepeatPenalty, "repeat_penalty", kNumber, 0, 100, generate.sampling.repeat_penalty, kNone)         \
  X(kRepeatLastN, "repeat_last_n", kInteger, 0, 16 * limits::kMaxGenerateTokens,                        \
    generate.sampling.repeat_last_n, kNone)                                                             \
  X(kLogprobs, "logprobs", kBoolean, 0, 0, generate.logprobs, kMapped)                                  \
  X(kTopLogprobs, "top_logprobs", kInteger, 0, limits::kMaxTopLogprobs, generate.top_logprobs, kMapped) \
  X(kNumCtx, "num_ctx", kInteger, 0, limits::kMaxContextTokens, generate.num_ctx, kNone)                \
  X(kKeepAlive, "keep_alive", kInteger, 0, limits::kMaxIdleSecs, keep_alive, kNone)                    \
  X(kDeadlineMs, "deadline_ms", kInteger, 1, limits::kMaxDeadlineMs, deadline, kNone)

enum class InferField {
#define CAR_INFER_FIELD_ENUM(e, name, type, lo, hi, member, openai) e,
  CAR_INFER_FIELDS(CAR_INFER_FIELD_ENUM)
#undef CAR_INFER_FIELD_ENUM
};

/// One row of the table, without its member (which only the parser needs).
struct InferFieldInfo {
  std::string_view name;
  FieldType type;
  double lo;  ///< kInteger / kNumber: the accepted range
  double hi;
  OpenAi openai;
};

inline constexpr InferFieldInfo kInferFields[] = {
#define CAR_INFER_FIELD_INFO(e, name, type, lo, hi, member, openai) \
  {name, FieldType::type, static_cast<double>(lo), static_cast<double>(hi), OpenAi::openai},
    CAR_INFER_FIELDS(CAR_INFER_FIELD_INFO)
#undef CAR_INFER_FIELD_INFO
};
inline constexpr std::size_t kInferFieldCount = std::size(kInferFields);

/// The row of `field`.
constexpr const InferFieldInfo& info(InferField field) {
  return kInferFields[static_cast<std::size_t>(field)];
}

/// Builds an InferParams field by field, each value read and checked by its row, then checks the request as
/// a whole. parse_infer runs it over a socket request's body; the HTTP front over the fields it maps from an
/// OpenAI request, so both fronts validate alike and hand the handler the same type.
class InferBuilder {
 public:
  /// Set `field` from `value` (null: absent). A refused value is kept for finish() to report (of several,
  /// the first in the table's order, whatever the order of the calls).
  void set(InferField field, nlohmann::json value);
  /// Was `field` set (to something other than null)?
  bool given(InferField field) const { return given_.test(static_cast<std::size_t>(field)); }
  /// The request, or bad_request naming the field: `model` missing or refused, `prompt` and `messages` both
  /// or neither, then the first value a row refused, then a field for `messages` without them or a
  /// `repeat_penalty` of 0.
  Result<InferParams> finish() &&;
  /// The first refused value (in the table's order) and its field, before finish(): the HTTP front names
  /// the parameter in its error object.
  const std::optional<Error>& refused() const { return error_; }
  InferField refused_field() const { return error_field_; }

 private:
  InferParams params_;
  std::bitset<kInferFieldCount> given_;
  std::optional<Error> error_;  // the refused value of the first field in the table's order
  InferField error_field_ = InferField::kModel;
};

/// Read `model` (required string). Error bad_request naming the field.
Result<std::string> model_field(const nlohmann::json& body);
/// Read the optional `stream_experts` field of load / infer: "on", "off" or "auto"; nullopt when absent or
/// null. Error bad_request for anything else.
Result<std::optional<StreamExperts>> stream_experts_field(const nlohmann::json& body);
/// Read the optional `keep_alive` field of load / infer: whole seconds the model stays loaded after the
/// request (0: unload it when the request ends; at most limits::kMaxIdleSecs, which the daemon then cuts to
/// its CAR_INFERENCE_MAX_KEEP_ALIVE_SECS); nullopt when absent or null. Error bad_request otherwise.
Result<std::optional<int64_t>> keep_alive_field(const nlohmann::json& body);
/// Read and validate every infer field (types and ranges; InferBuilder). Error bad_request naming the field.
Result<InferParams> parse_infer(const nlohmann::json& body);

}  // namespace car::protocol
