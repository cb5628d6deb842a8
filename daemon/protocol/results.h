// What a generation gives back, as types: the per-token logprob entries and the streamed token events.
// The runtime produces them, the request handler passes them on, and each front renders them in its own
// wire format (reply_lines.h for the socket, daemon/http/openai.h for HTTP). Plain aggregates.
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

}  // namespace car::protocol
