// The EnvironmentFile= syntax reader (see env_file.h).
#include "config/env_file.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/util/error_codes.h"

namespace car::config {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

std::string trim(std::string_view s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

bool valid_key(std::string_view k) {
  if (k.empty()) return false;
  if (!(std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_')) return false;
  return std::all_of(k.begin(), k.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; });
}

}  // namespace

Result<std::string> read_env_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(errc::kConfigFile, "cannot read config file " + path + ": " + std::strerror(errno));
  }
  std::string text;
  char buf[8192];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxEnvFileBytes) {
      return make_error(errc::kConfigFile, "config file " + path + " is larger than " +
                                               std::to_string(kMaxEnvFileBytes >> 20) + " MiB");
    }
  }
  if (in.bad()) return make_error(errc::kConfigFile, "error reading config file " + path);
  return text;
}

Result<std::vector<EnvAssignment>> parse_env_file(std::string_view text, std::string_view name) {
  // A state machine after systemd's env-file parser: comments only where a key could start; values
  // unquoted (backslash escapes, trailing whitespace dropped), '...' (verbatim) or "..." (shell escapes
  // for \" \\ \` \$ and line continuation); quoted and unquoted pieces concatenate.
  enum class State {
    pre_key,
    comment,
    key,
    pre_value,
    value,
    value_escape,
    single_quote,
    double_quote,
    double_quote_escape
  };
  std::vector<EnvAssignment> out;
  State state = State::pre_key;
  std::string key;
  std::string value;
  std::size_t value_keep = 0;  // length of `value` without trailing unquoted whitespace
  int line = 1;
  int start_line = 1;
  auto where = [&](int l) { return std::string(name) + ":" + std::to_string(l); };
  auto finish_assignment = [&]() -> Result<void> {
    value.resize(value_keep);
    std::string k = trim(key);
    if (!valid_key(k)) {
      return make_error(errc::kConfigFile, where(start_line) + ": '" + k + "' is not a valid variable name");
    }
    out.push_back(EnvAssignment{std::move(k), value, start_line});
    key.clear();
    value.clear();
    value_keep = 0;
    return {};
  };
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 BOM
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const bool eof = i == text.size();
    const char c = eof ? '\n' : text[i];
    if (!eof && c == '\0') return make_error(errc::kConfigFile, where(line) + ": NUL byte in config file");
    const bool newline = c == '\n';
    switch (state) {
      case State::pre_key:
        if (c == '#' || c == ';') {
          state = State::comment;
        } else if (c == '=') {  // "=value": an empty key, reported as invalid when the value ends
          start_line = line;
          key.clear();
          state = State::pre_value;
        } else if (!newline && !is_space(c)) {
          state = State::key;
          start_line = line;
          key.assign(1, c);
        }
        break;
      case State::comment:
        if (newline) state = State::pre_key;
        break;
      case State::key:
        if (newline) {
          key.clear();  // a line without '=' is ignored, as systemd does
          state = State::pre_key;
        } else if (c == '=') {
          state = State::pre_value;
        } else {
          key.push_back(c);
        }
        break;
      case State::pre_value:
        if (newline) {
          if (auto r = finish_assignment(); !r.ok()) return r.error();
          state = State::pre_key;
        } else if (c == '\'') {
          state = State::single_quote;
        } else if (c == '"') {
          state = State::double_quote;
        } else if (c == '\\') {
          state = State::value_escape;
        } else if (!is_space(c)) {
          value.push_back(c);
          value_keep = value.size();
          state = State::value;
        }
        break;
      case State::value:
        if (newline) {
          if (auto r = finish_assignment(); !r.ok()) return r.error();
          state = State::pre_key;
        } else if (c == '\\') {
          state = State::value_escape;
        } else {
          value.push_back(c);
          if (!is_space(c)) value_keep = value.size();
        }
        break;
      case State::value_escape:
        if (eof) return make_error(errc::kConfigFile, where(line) + ": backslash at end of file");
        if (!newline) {  // backslash-newline is a continuation; otherwise the next char is literal
          value.push_back(c);
          value_keep = value.size();
        }
        state = State::value;
        break;
      case State::single_quote:
        if (eof) return make_error(errc::kConfigFile, where(start_line) + ": unterminated ' quote");
        if (c == '\'') {
          state = State::pre_value;
        } else {
          value.push_back(c);
          value_keep = value.size();
        }
        break;
      case State::double_quote:
        if (eof) return make_error(errc::kConfigFile, where(start_line) + ": unterminated \" quote");
        if (c == '"') {
          state = State::pre_value;
        } else if (c == '\\') {
          state = State::double_quote_escape;
        } else {
          value.push_back(c);
          value_keep = value.size();
        }
        break;
      case State::double_quote_escape:
        if (eof) return make_error(errc::kConfigFile, where(start_line) + ": unterminated \" quote");
        if (c == '"' || c == '\\' || c == '`' || c == '$') {
          value.push_back(c);
        } else if (!newline) {
          value.push_back('\\');
          value.push_back(c);
        }
        value_keep = value.size();
        state = State::double_quote;
        break;
    }
    if (newline && !eof) ++line;
  }
  return out;
}

}  // namespace car::config
