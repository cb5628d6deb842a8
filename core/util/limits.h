// Bounds that more than one layer checks (the settings, the wire protocol, the offline tools): each is
// named here once so that the daemon, `car run` and the docs cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>

namespace car::limits {

/// The largest context (tokens) a model may be loaded with or a request may ask for (CAR_INFERENCE_CONTEXT,
/// `num_ctx`, `car run --context`, `car show --context`): 16 Mi tokens, beyond every published model.
inline constexpr int kMaxContextTokens = 1 << 24;

/// The most tokens one generation may ask for (`max_tokens` on the wire, `car run --max-tokens`, `car chat
/// --max-tokens`): a typo such as 1e9 is a bad request, not a day of decoding.
inline constexpr int kMaxGenerateTokens = 1 << 16;

/// The most alternatives a request may ask for per generated token (`top_logprobs` on the wire and in the
/// OpenAI API, `car infer --top-logprobs`): OpenAI's own bound.
inline constexpr int kMaxTopLogprobs = 20;

/// The longest idle TTL or keep-alive in seconds (CAR_INFERENCE_MODEL_IDLE_SECS, _MAX_KEEP_ALIVE_SECS, a
/// request's `keep_alive`): ten years, far beyond any use, and far from overflowing a nanosecond clock.
/// The longest `deadline_ms` a request may give: a week, far beyond any generation.
inline constexpr std::int64_t kMaxDeadlineMs = std::int64_t{7} * 24 * 3600 * 1000;
inline constexpr std::int64_t kMaxIdleSecs = std::int64_t{10} * 365 * 24 * 3600;

/// The longest Unix socket path (sizeof(sockaddr_un::sun_path) - 1): the NDJSON socket and a `unix:` HTTP
/// address are checked against it when the settings are read.
inline constexpr std::size_t kMaxSocketPath = 107;

/// The socket the system daemon listens on (the packaged socket unit's ListenStream=, root's default).
inline constexpr const char* kSystemSocketPath = "/run/car-inference/car-inference.sock";

}  // namespace car::limits
