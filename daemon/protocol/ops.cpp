#include "daemon/protocol/ops.h"

#include <iterator>

namespace car::protocol {

std::string_view wire_code(std::string_view code) {
  const ErrorCodeInfo* row = find_error_code(code);
  return row != nullptr && row->reach == Reach::kWire ? row->name : code::kInternal;
}

namespace {
constexpr std::string_view kOpNames[] = {
#define CAR_PROTOCOL_OP_NAME(e, name) name,
    CAR_PROTOCOL_OPS(CAR_PROTOCOL_OP_NAME)
#undef CAR_PROTOCOL_OP_NAME
};
}  // namespace

std::optional<Op> op_from_name(std::string_view name) {
  for (std::size_t i = 0; i < std::size(kOpNames); ++i) {
    if (kOpNames[i] == name) return static_cast<Op>(i);
  }
  return std::nullopt;
}

std::string_view op_name(Op op) {
  return kOpNames[static_cast<std::size_t>(op)];
}

const std::string& known_ops_text() {
  static const std::string text = [] {
    std::string t;
    for (std::string_view name : kOpNames) {
      if (!t.empty()) t += ", ";
      t += name;
    }
    return t;
  }();
  return text;
}

}  // namespace car::protocol
