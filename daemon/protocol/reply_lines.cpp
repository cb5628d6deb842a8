#include "daemon/protocol/reply_lines.h"

#include "core/util/result.h"

namespace car::protocol {

using nlohmann::json;

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {
/// One reply line built by appending literal text and serialized values (dump()'s serializer: compact,
/// invalid UTF-8 replaced), instead of copying the values into a document only to serialize it. The
/// literals spell the members in the order a document would (nlohmann::json sorts keys), so the bytes
/// are the same.
class LineBuilder {
 public:
  LineBuilder() : state_(thread_state()) {
    CAR_CHECK(!state_.building);  // one line at a time per thread
    state_.building = true;
    state_.out.clear();
  }
  ~LineBuilder() { state_.building = false; }
  LineBuilder(const LineBuilder&) = delete;
  LineBuilder& operator=(const LineBuilder&) = delete;
  LineBuilder& raw(std::string_view text) {
    state_.out.append(text);
    return *this;
  }
  LineBuilder& value(const json& v) {
    state_.serializer.dump(v, /*pretty_print=*/false, /*ensure_ascii=*/false, 0);
    return *this;
  }
  /// The line (a copy of the thread's buffer, which keeps its capacity for the next line).
  std::string take() { return state_.out; }

 private:
  /// One buffer and one serializer per thread, made once: a serializer's construction allocates its output
  /// adapter and reads the locale, which was a tenth of a small reply's cost. Lines are built one at a time
  /// on a thread (value() never calls back into a LineBuilder).
  struct State {
    bool building = false;
    std::string out;  // before serializer, which appends to it
    nlohmann::detail::serializer<json> serializer{nlohmann::detail::output_adapter<char, std::string>(out),
                                                  ' ', json::error_handler_t::replace};
  };
  static State& thread_state() {
    thread_local State state;
    return state;
  }
  State& state_;
};
}  // namespace

std::string ok_line(const json& id, const json& result) {
  return LineBuilder()
      .raw(R"({"id":)")
      .value(id)
      .raw(R"(,"ok":true,"result":)")
      .value(result)
      .raw("}")
      .take();
}

std::string error_line(const json& id, std::string_view code, std::string_view message) {
  return LineBuilder()
      .raw(R"({"error":{"code":)")
      .value(json(code))
      .raw(R"(,"message":)")
      .value(json(message))
      .raw(R"(},"id":)")
      .value(id)
      .raw(R"(,"ok":false})")
      .take();
}

namespace {

/// `{"logprob":...,"text":...,"token":...` - a logprob entry's members (the keys in a document's order),
/// without the closing brace.
void logprob_members(LineBuilder& b, const TokenLogprob& lp) {
  b.raw(R"({"logprob":)").value(json(lp.logprob)).raw(R"(,"text":)").value(json(lp.text));
  b.raw(R"(,"token":)").value(json(lp.token));
}

/// `[{"logprob","text","token"}, ...]`: the alternatives of one position.
void top_logprobs_array(LineBuilder& b, const TokenLogprobs& lp) {
  b.raw("[");
  for (std::size_t i = 0; i < lp.top_logprobs.size(); ++i) {
    if (i > 0) b.raw(",");
    logprob_members(b, lp.top_logprobs[i]);
    b.raw("}");
  }
  b.raw("]");
}

}  // namespace

std::string token_line(const json& id, const TokenEvent& event) {
  // The keys in the order a json object dumps them.
  LineBuilder b;
  b.raw(R"({"event":"token","id":)").value(id);
  if (event.logprobs) b.raw(R"(,"logprob":)").value(json(event.logprobs->logprob));
  b.raw(R"(,"text":)").value(json(event.text)).raw(R"(,"token":)").value(json(event.token));
  if (event.logprobs) {
    b.raw(R"(,"top_logprobs":)");
    top_logprobs_array(b, *event.logprobs);
  }
  return b.raw("}").take();
}

std::string infer_line(const json& id, const InferResult& r) {
  const GenerateOutput& out = r.output;
  // The result's members in the order a json object dumps them (sorted by key).
  LineBuilder b;
  b.raw(R"({"id":)").value(id).raw(R"(,"ok":true,"result":{)");
  if (!out.chat_template.empty()) b.raw(R"("chat_template":)").value(json(out.chat_template)).raw(",");
  b.raw(R"("finish_reason":)").value(json(out.finish_reason));
  if (r.keep_alive_given) {
    b.raw(R"(,"keep_alive_s":)").value(r.keep_alive_s ? json(*r.keep_alive_s) : json(nullptr));
  }
  if (r.logprobs) {
    b.raw(R"(,"logprobs":[)");
    for (std::size_t i = 0; i < out.logprobs.size(); ++i) {
      if (i > 0) b.raw(",");
      logprob_members(b, out.logprobs[i]);
      b.raw(R"(,"top_logprobs":)");
      top_logprobs_array(b, out.logprobs[i]);
      b.raw("}");
    }
    b.raw("]");
  }
  b.raw(R"(,"model":)").value(json(r.model));
  b.raw(R"(,"seed":)").value(json(r.seed));
  b.raw(R"(,"text":)").value(json(out.text));
  b.raw(R"(,"timings":{"decode_ms":)").value(json(out.decode_ms));
  b.raw(R"(,"load_ms":)").value(json(r.load_ms));
  b.raw(R"(,"prompt_ms":)").value(json(out.prompt_ms));
  b.raw(R"(,"queue_ms":)").value(json(r.queue_ms));
  b.raw(R"(,"ttft_ms":)").value(json(r.ttft_ms));
  b.raw(R"(},"tokens":[)");
  for (std::size_t i = 0; i < out.tokens.size(); ++i) {
    if (i > 0) b.raw(",");
    b.value(json(out.tokens[i]));
  }
  b.raw(R"(],"usage":{"cached_tokens":)").value(json(out.cached_tokens));
  b.raw(R"(,"completion_tokens":)").value(json(out.tokens.size()));
  b.raw(R"(,"prompt_tokens":)").value(json(out.prompt_tokens));
  return b.raw("}}}").take();
}

}  // namespace car::protocol
