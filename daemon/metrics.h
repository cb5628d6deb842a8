// Prometheus metrics of car-inferenced (text exposition format 0.0.4; the list: docs/metrics.md).
//
// Two layers:
//   - metrics::Registry and its families (counters, gauges, histograms with fixed buckets, each with a
//     fixed list of label names) plus metrics::Writer, which writes the exposition text (HELP/TYPE lines,
//     escaped label values, cumulative `_bucket{le=...}` lines ending with +Inf, `_sum`, `_count`).
//   - Metrics: the daemon's own families (requests, latencies, tokens, HTTP responses, cache evictions) and
//     the functions the request handler and the fronts call to record them. State that has an owner (cache
//     bytes and entries, in-flight requests, expert caches) is not pushed here:
//     RequestHandler::metrics_text() reads it from its owners at render time and writes it with the same
//     Writer.
//
// Hot path: a series is found once per observation under the family's short lock (no allocation when the
// series exists); its value is then updated with relaxed atomics. Every member is thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/result.h"
#include "core/util/thread_annotations.h"

namespace car::daemon {

namespace metrics {

/// Label values, in the order of the family's label names.
using LabelValues = std::initializer_list<std::string_view>;

/// `value` escaped for a label value: backslash, double quote and newline as \\, \" and \n; bytes that
/// are not valid UTF-8 replaced by U+FFFD.
std::string escape_label_value(std::string_view value);
/// `text` escaped for a HELP line: backslash and newline.
std::string escape_help(std::string_view text);
/// A sample value: integers without a fraction, +Inf, -Inf, NaN, else the shortest round-trip form.
std::string format_value(double value);

/// Writes the exposition text. One family at a time: family() then its samples.
class Writer {
 public:
  /// HELP and TYPE lines of `name` ("counter", "gauge" or "histogram").
  void family(std::string_view name, std::string_view help, std::string_view type);
  /// One sample line: `name{labels} value`. `names` and `values` have the same length.
  void sample(std::string_view name, const std::vector<std::string>& names,
              const std::vector<std::string>& values, double value);
  void sample(std::string_view name, double value) {
    static const std::vector<std::string> none;
    sample(name, none, none, value);
  }
  /// One label pair, e.g. {"model", id}.
  void sample(std::string_view name, std::string_view label, std::string_view label_value, double value);
  /// A histogram's lines from non-cumulative bucket counts (`counts` has bounds.size() + 1 entries, the last
  /// the overflow bucket): cumulative `_bucket{...,le=...}` incl. +Inf, `_sum`, `_count` (= the +Inf bucket).
  void histogram(std::string_view name, const std::vector<std::string>& names,
                 const std::vector<std::string>& values, const std::vector<double>& bounds,
                 const std::vector<uint64_t>& counts, double sum);
  const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void labels(const std::vector<std::string>& names, const std::vector<std::string>& values,
              std::string_view extra_name = {}, std::string_view extra_value = {});
  std::string out_;
};

/// A value that only goes up.
class Counter {
 public:
  void inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

/// A value that goes up and down.
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

/// Observations counted into fixed buckets (upper bounds, ascending, finite; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(const std::vector<double>& bounds);
  void observe(double v);
  /// Non-cumulative counts per bucket, the overflow bucket last; and the sum of the observations.
  std::vector<uint64_t> counts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const;

 private:
  const std::vector<double>& bounds_;  // the family's
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

/// Orders label value lists so that a lookup by string_views needs no allocation.
struct LabelsLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                        [](std::string_view x, std::string_view y) { return x < y; });
  }
};

/// What a Registry renders.
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names)
      : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}
  virtual ~Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;
  virtual void render(Writer& w) const = 0;
  const std::string& name() const { return name_; }

 protected:
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
};

/// A family of series of type T (Counter, Gauge, Histogram), one per label value list. Series are never
/// removed, so a reference from with() stays valid as long as the family.
template <typename T>
class SeriesFamily : public Family {
 public:
  using Family::Family;
  /// The series with these label values (as many as label names; checked), created on first use.
  T& with(LabelValues values) {
    CAR_CHECK(values.size() == label_names_.size());
    MutexLock lock(mutex_);
    auto it = series_.find(values);
    if (it == series_.end()) {
      it = series_.emplace(std::vector<std::string>(values.begin(), values.end()), make()).first;
    }
    return *it->second;
  }

 protected:
  virtual std::unique_ptr<T> make() const = 0;
  /// (label values, series) pairs in label order; the series outlive the lock (never removed).
  std::vector<std::pair<std::vector<std::string>, const T*>> snapshot() const {
    MutexLock lock(mutex_);
    std::vector<std::pair<std::vector<std::string>, const T*>> out;
    out.reserve(series_.size());
    for (const auto& [k, v] : series_) out.emplace_back(k, v.get());
    return out;
  }

 private:
  mutable Mutex mutex_;
  std::map<std::vector<std::string>, std::unique_ptr<T>, LabelsLess> series_ CAR_GUARDED_BY(mutex_);
};

class CounterFamily final : public SeriesFamily<Counter> {
 public:
  using SeriesFamily::SeriesFamily;
  void render(Writer& w) const override;

 protected:
  std::unique_ptr<Counter> make() const override { return std::make_unique<Counter>(); }
};

class GaugeFamily final : public SeriesFamily<Gauge> {
 public:
  using SeriesFamily::SeriesFamily;
  void render(Writer& w) const override;

 protected:
  std::unique_ptr<Gauge> make() const override { return std::make_unique<Gauge>(); }
};

class HistogramFamily final : public SeriesFamily<Histogram> {
 public:
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds);
  void render(Writer& w) const override;
  const std::vector<double>& bounds() const { return bounds_; }

 protected:
  std::unique_ptr<Histogram> make() const override { return std::make_unique<Histogram>(bounds_); }

 private:
  const std::vector<double> bounds_;
};

/// Families in registration order. Register them up front (names are checked: [a-zA-Z_:][a-zA-Z0-9_:]*,
/// unique; `le` is no label name), then record from any thread.
class Registry {
 public:
  CounterFamily& counter(std::string name, std::string help, std::vector<std::string> label_names = {});
  GaugeFamily& gauge(std::string name, std::string help, std::vector<std::string> label_names = {});
  /// `bounds`: ascending finite upper bounds.
  HistogramFamily& histogram(std::string name, std::string help, std::vector<std::string> label_names,
                             std::vector<double> bounds);
  /// Every family, in registration order.
  void render(Writer& w) const;

 private:
  template <typename F, typename... Args>
  F& add(Args&&... args);
  mutable Mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_ CAR_GUARDED_BY(mutex_);
};

/// Is `name` a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)? Label names: the same without ':'.
bool valid_metric_name(std::string_view name);
bool valid_label_name(std::string_view name);

}  // namespace metrics

/// The daemon's metrics (docs/metrics.md). One per RequestHandler; every member is thread-safe.
class Metrics {
 public:
  Metrics();

  // ---- for the HTTP front ----
  /// Count one HTTP response: `endpoint` is the route that answered (e.g. "/v1/chat/completions"; use one
  /// fixed value such as "other" for paths that matched no route, so the series stay few), `status` its HTTP
  /// status. Series: car_inference_http_requests_total{endpoint, status}. Any thread.
  void count_http(std::string_view endpoint, int status);

  // ---- for the request handler ----
  /// One answered request: `op` its wire op ("unknown" when none was recognized), `outcome` the handler's
  /// outcome text ("ok", "ok(hit)", a protocol error code...); counted as "ok" or the error code.
  void count_request(std::string_view op, std::string_view outcome);
  /// From receipt to the start of its job on a worker (load and infer).
  void observe_queue_wait(double seconds);
  /// A model load that ran the loader (successful or not).
  void observe_load(double seconds);
  /// One finished generation: prompt tokens and time, completion tokens and decode time, finish reason, and
  /// how many of its prompt tokens came from its sequence's cache (not computed).
  void observe_generation(uint64_t prompt_tokens, double prompt_seconds, uint64_t completion_tokens,
                          double decode_seconds, std::string_view finish_reason, uint64_t cached_tokens);
  /// A generation's first token, `seconds` after its request arrived, and the gaps between its tokens.
  void observe_first_token(std::string_view model, double seconds);
  void observe_inter_token(std::string_view model, const std::vector<float>& gaps_ms);
  /// A cache entry left the cache (BackendCache's eviction listener).
  void observe_eviction(std::string_view cause, double age_seconds);

  /// The pushed families' text.
  void render(metrics::Writer& w) const { registry_.render(w); }

  /// The bucket bounds (seconds) of each histogram, for tests.
  static const std::vector<double>& latency_buckets();
  static const std::vector<double>& per_token_buckets();
  static const std::vector<double>& age_buckets();
  static const std::vector<double>& length_buckets();

 private:
  metrics::Registry registry_;
  metrics::CounterFamily& requests_;
  metrics::CounterFamily& http_;
  metrics::HistogramFamily& queue_wait_;
  metrics::HistogramFamily& load_;
  metrics::HistogramFamily& prompt_;
  metrics::HistogramFamily& decode_per_token_;
  metrics::CounterFamily& prompt_tokens_;
  metrics::CounterFamily& cached_tokens_;
  metrics::CounterFamily& completion_tokens_;
  metrics::CounterFamily& finish_;
  metrics::HistogramFamily& eviction_age_;
  metrics::HistogramFamily& ttft_;
  metrics::HistogramFamily& itl_;
  metrics::HistogramFamily& prompt_length_;
  metrics::HistogramFamily& generation_length_;
  // Series without labels, found once.
  metrics::Histogram& queue_wait_series_;
  metrics::Histogram& load_series_;
  metrics::Histogram& prompt_series_;
  metrics::Histogram& decode_series_;
  metrics::Counter& prompt_tokens_series_;
  metrics::Counter& cached_tokens_series_;
  metrics::Counter& completion_tokens_series_;
};

}  // namespace car::daemon
