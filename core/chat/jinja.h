// A Jinja interpreter for chat templates (the Jinja text in GGUF `tokenizer.chat_template`).
//
// Template::parse lexes (trim_blocks and lstrip_blocks on, as transformers sets them; one trailing newline
// dropped) and parses the text into an AST; Template::render evaluates it against a context dict. Both
// return a Result: unsupported syntax, type errors and exhausted limits are Errors naming the construct and
// its line:col, and `raise_exception(msg)` gives code "raise_exception" with `msg` as the message. A
// template is untrusted input: nesting depth, evaluation steps, macro recursion, string and list sizes and
// the output are bounded (RenderLimits). docs/chat.md lists the supported subset.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/chat/value.h"
#include "core/util/result.h"

namespace car::chat {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;  ///< the rendered text
  size_t max_string_bytes = 64u << 20;  ///< any one string value
  size_t max_list_items = 1u << 20;     ///< any one list (and range())
  uint64_t max_steps = 50'000'000;      ///< statements + expressions evaluated
  int max_call_depth = 64;              ///< nested macro calls
  /// Wall-clock time of one render (the deadline): the step limit alone lets a hostile template hold a
  /// thread for many seconds.
  std::chrono::milliseconds max_duration{10'000};
  /// Stack the evaluator's recursion may use below the render's entry (also never the thread's last
  /// StackLimit::kReserveBytes). The depth limits keep real templates far below it.
  size_t max_stack_bytes = 2u << 20;
};

struct RenderOptions {
  RenderLimits limits;
  /// The clock strftime_now() reads (local time); nullopt: the system clock.
  std::optional<std::tm> now;
  /// Follow @huggingface/jinja (transformers.js), the conformance reference, where it differs from Python
  /// Jinja2 in ways real templates reach: str.strip/lstrip/rstrip(chars) ignore `chars` and strip
  /// whitespace. Off: Python's behaviour (strip exactly those characters).
  bool js_strip_quirk = false;
  /// Set (from another thread) to stop the render: it fails with code "cancelled" within ~1024 steps.
  const std::atomic<bool>* cancelled = nullptr;
};

struct Node;

class Template {
 public:
  /// Lexes and parses `source`; a syntax error (or a construct outside the supported subset) is an Error
  /// with code "template_syntax" and "line L:C" in its message.
  static Result<Template> parse(std::string_view source);

  /// Renders with `context` (a dict: the top-level variables). Errors: "template_error" (type errors,
  /// unknown filters, limits: steps, time, stack, sizes), "raise_exception" (the template's own
  /// raise_exception(msg); message = msg), "cancelled" (options.cancelled was set).
  Result<std::string> render(const Value& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

/// One-shot parse + render.
Result<std::string> render_template(std::string_view source, const Value& context,
                                    const RenderOptions& options = {});

}  // namespace car::chat
