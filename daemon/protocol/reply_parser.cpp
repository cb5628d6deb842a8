#include "daemon/protocol/reply_parser.h"

#include "core/util/error_codes.h"

namespace car::protocol {

using nlohmann::json;

Result<Reply> parse_reply(std::string_view line) {
  json doc = json::parse(line.begin(), line.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(errc::kProtocolError, "the daemon sent a line that is not a JSON object");
  }
  Reply r;
  if (auto it = doc.find("id"); it != doc.end()) r.id = *it;
  if (auto ev = doc.find("event"); ev != doc.end()) {
    if (!ev->is_string()) return make_error(errc::kProtocolError, "event name is not a string");
    r.is_event = true;
    r.event = ev->get<std::string>();
    r.raw = std::move(doc);
    return r;
  }
  auto ok = doc.find("ok");
  if (ok == doc.end() || !ok->is_boolean())
    return make_error(errc::kProtocolError, "reply has no boolean 'ok'");
  r.ok = ok->get<bool>();
  if (r.ok) {
    if (auto res = doc.find("result"); res != doc.end()) r.result = *res;
  } else {
    auto err = doc.find("error");
    if (err == doc.end() || !err->is_object())
      return make_error(errc::kProtocolError, "failed reply has no 'error'");
    r.error_code = err->value("code", std::string("unknown"));
    r.error_message = err->value("message", std::string());
  }
  r.raw = std::move(doc);
  return r;
}

}  // namespace car::protocol
