// How BackendCache<T> (core/cache/backend_cache.h) runs what a caller hands it on a miss: the size
// estimate (a byte count, or a callable returning one) and the loader (returning T, Result<T>, Sized<T> or
// Result<Sized<T>>), each outside the cache's lock. An exception from either becomes
// Error{"load_failed", what()}: nothing thrown by a loader crosses the cache. Also the message for a
// backend larger than the whole budget. Pure functions; thread-safe as the callables they run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "core/util/error_codes.h"
#include "core/util/result.h"

namespace car {

/// A loaded backend and the bytes it really holds: what a loader returns to correct the charge its
/// estimate made (the cache charges `size_bytes` from then on).
template <typename T>
struct Sized {
  T backend;
  std::uint64_t size_bytes = 0;
};

namespace cache_detail {

/// The loader's outcome as the cache keeps it; `size_bytes` is nullopt when the loader did not measure it.
template <typename T>
struct Loaded {
  T backend;
  std::optional<std::uint64_t> size_bytes;
};

/// Run `loader` (see the top of this file); an exception becomes load_failed.
template <typename T, typename Loader>
Result<Loaded<T>> run_loader(Loader& loader) {
  using R = std::invoke_result_t<Loader&>;
  try {
    if constexpr (std::is_convertible_v<R, Result<Sized<T>>> && !std::is_convertible_v<R, Result<T>>) {
      Result<Sized<T>> r(loader());
      if (!r.ok()) return r.error();
      return Loaded<T>{std::move(r.value().backend), r.value().size_bytes};
    } else if constexpr (std::is_convertible_v<R, Result<T>>) {
      Result<T> r(loader());
      if (!r.ok()) return r.error();
      return Loaded<T>{std::move(r.value()), std::nullopt};
    } else {
      return Loaded<T>{T(loader()), std::nullopt};
    }
  } catch (const std::exception& e) {
    return make_error(errc::kLoadFailed, e.what());
  } catch (...) {
    return make_error(errc::kLoadFailed, "loader threw a non-standard exception");
  }
}

/// The bytes `estimate` says (an integer, or a callable returning one or a Result); an exception becomes
/// load_failed.
template <typename Estimate>
Result<std::uint64_t> run_estimate(Estimate& estimate) {
  using E = std::remove_cvref_t<Estimate>;
  if constexpr (std::is_integral_v<E>) {
    if constexpr (std::is_signed_v<E>) CAR_CHECK(estimate >= 0);
    return static_cast<std::uint64_t>(estimate);
  } else {
    try {
      using R = std::invoke_result_t<Estimate&>;
      if constexpr (std::is_integral_v<R>) {
        return static_cast<std::uint64_t>(estimate());
      } else {
        return Result<std::uint64_t>(estimate());
      }
    } catch (const std::exception& e) {
      return make_error(errc::kLoadFailed, e.what());
    } catch (...) {
      return make_error(errc::kLoadFailed, "the size estimate threw a non-standard exception");
    }
  }
}

/// "'KEY' needs N bytes (X MiB, estimated) but the whole cache budget is M bytes (...); ..." (`measured`:
/// "holds", after loading).
inline std::string too_large(const std::string& key, std::uint64_t bytes, std::uint64_t budget,
                             bool measured) {
  auto mib = [](std::uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
    return std::string(buf);
  };
  return "'" + key + "' " + (measured ? "holds " : "needs ") + std::to_string(bytes) + " bytes (" +
         mib(bytes) + (measured ? ", measured after loading" : ", estimated") +
         ") but the whole cache budget is " + std::to_string(budget) + " bytes (" + mib(budget) +
         "); raise the budget or use a smaller model";
}

}  // namespace cache_detail
}  // namespace car
