// What engine::generate() takes (GenerateRequest), streams (TokenEvent) and returns (GenerateResult), apart from engine.h so that
// a front end (the daemon's protocol layer) can parse a request straight into it without the engine.
// Plain aggregates: no code to link.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/engine/sampler.h"

namespace car::engine {

struct GenerateRequest {
  std::string prompt;               ///< tokenized with the model's tokenizer unless prompt_ids is set
  std::vector<int32_t> prompt_ids;  ///< used as-is when non-empty
  bool add_bos = true;              ///< add BOS (when the model's vocabulary asks for it)
  bool parse_special = false;       ///< let special-token text in the prompt become special tokens
  int max_tokens = 128;
  /// Generate until the request's context is full (at most limits::kMaxGenerateTokens) instead of
  /// max_tokens: Ollama's num_predict -1. Such a request reserves its whole context in the model's KV pool,
  /// or the whole pool where that is smaller (and then stops when the pool is full). A prompt that fills
  /// the context (or that pool) is still context_overflow.
  bool max_tokens_to_context = false;
  /// The context window of this request in tokens (prompt + max_tokens must fit): 0 = the whole context
  /// the model is loaded with; larger than that is bad_request.
  int num_ctx = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;  ///< stop strings (not included in the output)
  int top_logprobs = 0;           ///< K most likely ids per generated position (implies logprobs)
  bool logprobs = false;          ///< report each generated id's own logprob (Sampler::logprob_of)
  /// Keep generating past end-of-generation tokens until max_tokens (finish_reason "length"); `car bench`
  /// uses it to decode exactly max_tokens tokens after random prompt ids.
  bool ignore_eos = false;
};

struct TokenEvent {
  int32_t token = 0;
  std::string text;  ///< decoded bytes released by this token (never a partial UTF-8 character)
  /// With request.logprobs / top_logprobs (not for the final token = -1 event): the id's logprob and the
  /// K most likely ids at its position.
  double logprob = 0;
  std::vector<TopLogprob> top_logprobs;
};

struct GenerateResult {
  std::vector<int32_t> prompt_tokens;
  /// Prompt tokens not computed for this request: the prefix its slot already held in its KV cache (a
  /// chat's earlier turns). At most prompt_tokens.size() - 1 (the last one is always evaluated for logits).
  int64_t cached_tokens = 0;
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;  ///< "length" | "stop" | "eos" | "cancelled"
  double queue_ms = 0;   ///< from submission to the first step that includes the request (slot wait included)
  double prompt_ms = 0;  ///< from that step to the prompt's logits
  double ttft_ms = 0;    ///< from submission to the first token (0 when none was sampled)
  std::vector<float> itl_ms;  ///< inter-token latency: for each token after the first, ms since the one before
  double decode_ms = 0;
  std::vector<std::vector<TopLogprob>> top_logprobs;  ///< per generated token, when request.top_logprobs > 0
  std::vector<double> logprobs;  ///< per generated token: the chosen id's logprob, when request.logprobs
};

}  // namespace car::engine
