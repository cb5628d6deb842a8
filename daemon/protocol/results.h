// What a generation gives back, as types: the per-token logprob entries, the streamed token events, the
// runtime's output and the `infer` result the request handler delivers. The runtime produces them, the
// handler passes them on, and each front renders them in its own wire format (reply_lines.h for the
// socket, daemon/http/openai.h for HTTP) - no JSON in between. Plain aggregates.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace car::protocol {

/// One generated token's logprob entry, as the final result's `logprobs` array and a streamed token event
/// carry it: the id, its own text (token_to_piece, special tokens as text; may be a partial UTF-8
/// character, sent with U+FFFD), its full-vocabulary log-probability before penalties and filters, and the
/// K most likely ids at that position.
struct TokenLogprob {
  int32_t token = 0;
  std::string text;
  double logprob = 0;
};
struct TokenLogprobs : TokenLogprob {
  std::vector<TokenLogprob> top_logprobs;
};

/// A streamed token: the id (-1 for the text held back at the end), the text it released, and with
/// `logprobs` / `top_logprobs` its logprob entry.
struct TokenEvent {
  int32_t token = 0;
  std::string text;
  std::optional<TokenLogprobs> logprobs;
};

/// What one generation produced (ModelRuntime's Backend::generate).
struct GenerateOutput {
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;  ///< "length" | "stop" | "eos" | "cancelled"
  std::string
      chat_template;  ///< for `messages`: "model" or "request" (whose template rendered them); else ""
  int prompt_tokens = 0;
  /// Of prompt_tokens, those not computed: the prefix the model's sequence already held (a chat's history).
  int cached_tokens = 0;
  double queue_ms = 0;   ///< waiting for a sequence of the model (its scheduler's queue), and for the first step
  double ttft_ms = 0;    ///< from the runtime's start to the first token (queue_ms + the prompt)
  double prompt_ms = 0;
  double decode_ms = 0;
  std::vector<float> itl_ms;  ///< for each token after the first, ms since the one before (for /metrics)
  /// One entry per generated token when the request asked for logprobs / top_logprobs; else empty.
  std::vector<TokenLogprobs> logprobs;
};

/// An `infer` request's result as the handler delivers it to a front: the generation and what the daemon
/// adds around it (docs/protocol.md, `infer`). Usage is output.prompt_tokens, output.cached_tokens and output.tokens.size().
struct InferResult {
  std::string model;
  GenerateOutput output;
  uint64_t seed = 0;      ///< the seed the sampler used (the request's, or the one the daemon drew)
  bool logprobs = false;  ///< the request asked for logprobs: output.logprobs is part of the result
  double load_ms = 0;     ///< getting the model (the cache lookup on a hit)
  double queue_ms = 0;    ///< from the request's arrival until its first step (worker and model queues)
  double ttft_ms = 0;     ///< from the request's arrival to its first token (0 when none)
  /// The request gave `keep_alive`: the result reports `keep_alive_s`, what now applies - keep_alive_s, or
  /// nullopt (null) when the model is never evicted for idleness (pinned).
  bool keep_alive_given = false;
  std::optional<int64_t> keep_alive_s;
};

}  // namespace car::protocol
