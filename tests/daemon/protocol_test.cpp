// The wire protocol's tables: ops and wire codes from one table, and the error-code table against
// docs/protocol.md. (Requests, the schema, reply lines and framing have protocol_*_test.cpp beside this one;
// the resolver, worker pool, connection limits and safe_text their own files.)
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/error_codes.h"
#include "daemon/protocol.h"
#include "tests/test_support.h"

#ifndef CAR_SOURCE_DIR
#error "CAR_SOURCE_DIR must name the source tree (tests/daemon/CMakeLists.txt)"
#endif

namespace car {
namespace {

using nlohmann::json;

TEST(DaemonProtocol, OpsAndWireCodesComeFromOneTable) {
  EXPECT_EQ(protocol::op_from_name("health"), protocol::Op::kHealth);
  EXPECT_EQ(protocol::op_from_name("invalidate"), protocol::Op::kInvalidate);
  EXPECT_FALSE(protocol::op_from_name("Health").has_value());
  EXPECT_FALSE(protocol::op_from_name("").has_value());
  for (auto op : {protocol::Op::kLoad, protocol::Op::kInfer, protocol::Op::kStats, protocol::Op::kInvalidate,
                  protocol::Op::kList, protocol::Op::kHealth, protocol::Op::kCancel}) {
    EXPECT_EQ(protocol::op_from_name(protocol::op_name(op)), op);
  }
  EXPECT_EQ(protocol::known_ops_text(), "load, infer, stats, metrics, invalidate, list, health, cancel");
  // Codes a runtime or the cache may report pass through; the rest (and unknown ones) become internal.
  for (const char* code : {"bad_request", "not_found", "forbidden", "load_failed", "context_overflow",
                           "cancelled", "shutting_down", "busy", "io_error"}) {
    EXPECT_EQ(protocol::wire_code(code), code);
  }
  for (const char* code :
       {"gguf_truncated", "", "unknown_op", "line_timeout", "output_overflow", "too_many_connections"}) {
    EXPECT_EQ(protocol::wire_code(code), protocol::code::kInternal) << code;
  }
}

TEST(DaemonProtocol, TheErrorCodeTableSpellsEachCodeOnce) {
  std::set<std::string_view> names;
  for (const ErrorCodeInfo& row : kErrorCodes) {
    EXPECT_TRUE(names.insert(row.name).second) << "code " << row.name << " appears twice";
    EXPECT_FALSE(row.meaning.empty()) << row.name;
    for (char c : row.name)
      EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') << row.name;
    EXPECT_EQ(find_error_code(row.name), &row);
  }
  EXPECT_EQ(find_error_code("no_such_code"), nullptr);
  EXPECT_STREQ(protocol::code::kLineTimeout, errc::kLineTimeout) << "the protocol's codes are the table's";
}

/// The codes in docs/protocol.md's "Error codes" table, in order.
std::vector<std::string> documented_wire_codes() {
  std::ifstream in(std::string(CAR_SOURCE_DIR) + "/docs/protocol.md");
  EXPECT_TRUE(in.good()) << "cannot read docs/protocol.md";
  std::vector<std::string> codes;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = line == "## Error codes";
      continue;
    }
    // Rows look like "| `bad_request` | when ... |".
    if (!in_section || line.rfind("| `", 0) != 0) continue;
    const auto end = line.find('`', 3);
    if (end != std::string::npos) codes.push_back(line.substr(3, end - 3));
  }
  return codes;
}

TEST(DaemonProtocol, DocsListTheTablesWireCodes) {
  std::set<std::string> documented;
  for (const std::string& code : documented_wire_codes()) {
    EXPECT_TRUE(documented.insert(code).second) << "docs/protocol.md lists " << code << " twice";
  }
  std::set<std::string> wire;
  for (const ErrorCodeInfo& row : kErrorCodes) {
    if (row.reach != Reach::kLocal) wire.insert(std::string(row.name));
  }
  EXPECT_EQ(documented, wire) << "docs/protocol.md's \"Error codes\" table and the wire rows of "
                                 "core/util/error_codes.h differ";
}

}  // namespace
}  // namespace car
