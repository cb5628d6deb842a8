// The protocol's two tables: the request ops (CAR_PROTOCOL_OPS, enumerator and wire name) and the wire
// error codes (the wire rows of core/util/error_codes.h). Pure; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/util/error_codes.h"

namespace car::protocol {

/// The error codes (CONTRACT.md): the wire rows of car's one code table (core/util/error_codes.h, Reach
/// kWire and kWireDaemon), under the names the daemon has always used (`protocol::code::kBadRequest`).
/// Stable: clients and tests match on them.
namespace code = ::car::errc;

/// The wire code for an error code reported by the runtime or the cache: itself when its row's Reach is
/// kWire, else `internal`.
std::string_view wire_code(std::string_view code);

/// The request ops, one row each: enumerator and wire name.
#define CAR_PROTOCOL_OPS(X)    \
  X(kLoad, "load")             \
  X(kInfer, "infer")           \
  X(kStats, "stats")           \
  X(kMetrics, "metrics")       \
  X(kInvalidate, "invalidate") \
  X(kList, "list")             \
  X(kHealth, "health")         \
  X(kCancel, "cancel")

enum class Op {
#define CAR_PROTOCOL_OP_ENUM(e, name) e,
  CAR_PROTOCOL_OPS(CAR_PROTOCOL_OP_ENUM)
#undef CAR_PROTOCOL_OP_ENUM
};

/// The op named `name`, or nullopt for an unknown op.
std::optional<Op> op_from_name(std::string_view name);
/// The wire name of `op`.
std::string_view op_name(Op op);
/// "load, infer, ..." in table order, for the unknown_op message.
const std::string& known_ops_text();

}  // namespace car::protocol
