// The expert-usage sidecar: how often each routed expert of a model was used, kept across runs so the
// streamed source can pin the hot ones at the next start.
//
// Format (the seed's, so either side reads the other's file): text, one record per line,
//     <tensor name> <expert> <count>\n
// the tensor name being a bank, `blk.<layer>.ffn_{gate,up,down}_exps.weight`. An expert's gate, up and down
// carry the same count (the three are always fetched together); reading takes the largest of the three, so a
// file whose banks disagree still gives one count per (layer, expert). Lines starting with '#' are comments.
// A line that is not a well-formed record of this model (bad name, layer or expert out of range, a count
// that is not a decimal u64, extra fields) or that has no final newline (a torn write) is skipped with a
// warning. Writing is crash-safe: a temp file in the same directory, fsync, rename, fsync of the directory.
//
// Pure functions apart from the file I/O; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/result.h"

namespace car::experts {

/// (layer, expert) -> count.
using UsageCounts = std::map<std::pair<int, int>, uint64_t>;

struct SidecarContents {
  UsageCounts counts;
  std::vector<std::string> warnings;  ///< one per skipped line (at most kMaxSidecarWarnings, then a summary)
};

inline constexpr size_t kMaxSidecarWarnings = 8;

/// "blk.<layer>.ffn_<gate|up|down>_exps.weight" for projection 0, 1, 2.
std::string bank_tensor_name(int layer, int projection);

/// Parse sidecar text. n_expert[layer] is the model's experts per layer (0 = dense layer): a record naming
/// another layer or expert is foreign. `origin` names the file in warnings.
SidecarContents parse_sidecar(std::string_view text, std::span<const int> n_expert,
                              const std::string& origin);

/// Read and parse `path`. A missing file is empty and silent; an unreadable one is a warning.
SidecarContents read_sidecar(const std::string& path, std::span<const int> n_expert);

/// The file text for `counts` (three records per (layer, expert), sorted), after a comment header.
std::string format_sidecar(const UsageCounts& counts);

/// Write `text` to `path` crash-safely (temp file beside it + fsync + rename + fsync of the directory),
/// creating the directory if needed. Errors: "io_error" naming the path and errno text.
Result<void> write_file_atomic(const std::string& path, std::string_view text);

}  // namespace car::experts
