// Did-you-mean suggestions: the known name nearest to a mistyped one (a request field, a setting, a
// command or a flag). Header-only; pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace car {

/// Levenshtein distance of two short names (case-sensitive).
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// The candidate nearest `word` when `word` is a plausible misspelling of it - at most a third of the
/// candidate's length edited (at least one edit allowed); empty when none is that close. Ties go to the
/// first candidate.
template <typename Range>
std::string closest_name(std::string_view word, const Range& candidates) {
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::string_view name(c);
    const std::size_t d = edit_distance(word, name);
    if (d < best_distance && d <= std::max<std::size_t>(1, name.size() / 3)) {
      best_distance = d;
      best = std::string(name);
    }
  }
  return best;
}

}  // namespace car
