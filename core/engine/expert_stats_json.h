// ExpertStats as JSON: the `experts` object of `car run --json` / `car bench --json` and the per-model
// entries of the daemon's `stats.experts` (docs/protocol.md). One field list for both.
//
// Header-only and not part of car_engine (which does not depend on nlohmann_json): include it from
// targets that link nlohmann_json.
#pragma once

#include <nlohmann/json.hpp>

#include "core/experts/expert_source.h"

namespace car::engine {

inline nlohmann::json expert_stats_json(const experts::ExpertStats& s) {
  return {{"mode", s.mode},
          {"budget_bytes", s.budget_bytes},
          {"cache_bytes", s.cache_bytes},
          {"floor_bytes", s.floor_bytes},
          {"resident_bytes", s.resident_bytes},
          {"bytes_read", s.bytes_read},
          {"banks", s.banks},
          {"cap", s.cap},
          {"pinned", s.pinned},
          {"cached", s.cached},
          {"hits", s.hits},
          {"misses", s.misses},
          {"hit_rate", s.hit_rate},
          {"read_p50_us", s.read_p50_us},
          {"read_p99_us", s.read_p99_us},
          {"prefetch_issued", s.prefetch_issued},
          {"prefetch_used", s.prefetch_used},
          {"prefetch_recall", s.prefetch_recall},
          {"prefetch_precision", s.prefetch_precision},
          {"prefetch_layers_on", s.prefetch_layers_on},
          {"prefetch_scored", s.prefetch_scored}};
}

}  // namespace car::engine
