// The one type of the "stream MoE experts from disk" decision, carried from the settings
// (CAR_INFERENCE_STREAM_EXPERTS), the wire (`stream_experts` on load/infer) and `car run --stream-experts` to
// the engine (engine::LoadOptions) without being turned back into text on the way.
#pragma once

#include <optional>
#include <string_view>

namespace car {

/// `on`: stream whenever the model has routed experts; `off`: keep them resident; `auto` (automatic): stream
/// when the model file is larger than the memory the process may use.
enum class StreamExperts { on, off, automatic };

constexpr std::string_view to_string(StreamExperts v) {
  switch (v) {
    case StreamExperts::on:
      return "on";
    case StreamExperts::off:
      return "off";
    case StreamExperts::automatic:
      return "auto";
  }
  return "auto";
}

/// "on", "off" or "auto" (exactly, as the wire and the settings spell them); nullopt for anything else.
constexpr std::optional<StreamExperts> parse_stream_experts(std::string_view text) {
  for (StreamExperts v : {StreamExperts::on, StreamExperts::off, StreamExperts::automatic}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

}  // namespace car
