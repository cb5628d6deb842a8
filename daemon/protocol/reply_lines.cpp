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
    nlohmann::detail::serializer<json> serializer{nlohmann::detail::output_adapter<char, std::string>(out), ' ',
                                                  json::error_handler_t::replace};
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
json logprob_entry(const TokenLogprob& lp) {
  return {{"token", lp.token}, {"text", lp.text}, {"logprob", lp.logprob}};
}
json top_json(const TokenLogprobs& lp) {
  json top = json::array();
  for (const auto& t : lp.top_logprobs) top.push_back(logprob_entry(t));
  return top;
}
}  // namespace

json logprobs_json(const TokenLogprobs& lp) {
  json j = logprob_entry(lp);
  j["top_logprobs"] = top_json(lp);
  return j;
}

std::string token_line(const json& id, const TokenEvent& event) {
  if (event.logprobs) {
    json j = {{"id", id}, {"event", "token"}, {"text", event.text}, {"token", event.token}};
    j["logprob"] = event.logprobs->logprob;
    j["top_logprobs"] = top_json(*event.logprobs);
    return dump(j);
  }
  // The common case without a document (the keys in the order a json object dumps them).
  return LineBuilder()
      .raw(R"({"event":"token","id":)")
      .value(id)
      .raw(R"(,"text":)")
      .value(json(event.text))
      .raw(R"(,"token":)")
      .value(json(event.token))
      .raw("}")
      .take();
}

}  // namespace car::protocol
