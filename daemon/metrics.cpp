#include "daemon/metrics.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

#include "daemon/safe_text.h"

namespace car::daemon {

namespace metrics {

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size();) {
    const char c = value[i];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      const std::size_t n = utf8_sequence_length(value.substr(i));
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD for one invalid byte
        ++i;
        continue;
      }
      out.append(value.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
  return out;
}

std::string escape_help(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::to_chars_result r{};
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(value));
  } else {
    r = std::to_chars(buf, buf + sizeof buf, value);  // shortest form that reads back as `value`
  }
  return std::string(buf, r.ptr);
}

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && (i == 0 || c < '0' || c > '9')) return false;
  }
  return true;
}

bool valid_label_name(std::string_view name) {
  return valid_metric_name(name) && name.find(':') == std::string_view::npos;
}

// ---- Writer ----

void Writer::family(std::string_view name, std::string_view help, std::string_view type) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += escape_help(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void Writer::labels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                    std::string_view extra_name, std::string_view extra_value) {
  if (names.empty() && extra_name.empty()) return;
  out_ += '{';
  bool first = true;
  auto pair = [&](std::string_view n, std::string_view v) {
    if (!first) out_ += ',';
    first = false;
    out_ += n;
    out_ += "=\"";
    out_ += escape_label_value(v);
    out_ += '"';
  };
  for (std::size_t i = 0; i < names.size(); ++i) pair(names[i], values.at(i));
  if (!extra_name.empty()) pair(extra_name, extra_value);
  out_ += '}';
}

void Writer::sample(std::string_view name, const std::vector<std::string>& names,
                    const std::vector<std::string>& values, double value) {
  out_ += name;
  labels(names, values);
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void Writer::sample(std::string_view name, std::string_view label, std::string_view label_value,
                    double value) {
  const std::vector<std::string> names{std::string(label)}, values{std::string(label_value)};
  sample(name, names, values, value);
}

void Writer::histogram(std::string_view name, const std::vector<std::string>& names,
                       const std::vector<std::string>& values, const std::vector<double>& bounds,
                       const std::vector<uint64_t>& counts, double sum) {
  CAR_CHECK(counts.size() == bounds.size() + 1);
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= bounds.size(); ++i) {
    cumulative += counts[i];
    out_ += bucket;
    labels(names, values, "le", i < bounds.size() ? format_value(bounds[i]) : "+Inf");
    out_ += ' ';
    out_ += format_value(static_cast<double>(cumulative));
    out_ += '\n';
  }
  sample(std::string(name) + "_sum", names, values, sum);
  sample(std::string(name) + "_count", names, values, static_cast<double>(cumulative));
}

// ---- Histogram ----

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds.size() + 1)) {
  for (std::size_t i = 0; i <= bounds.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  // The first bucket whose upper bound is >= v (bounds are inclusive, as `le` says); NaN goes to +Inf.
  const std::size_t i =
      std::isnan(v)
          ? bounds_.size()
          : static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t Histogram::count() const {
  uint64_t n = 0;
  for (uint64_t c : counts()) n += c;
  return n;
}

// ---- families ----

void CounterFamily::render(Writer& w) const {
  w.family(name_, help_, "counter");
  for (const auto& [values, c] : snapshot())
    w.sample(name_, label_names_, values, static_cast<double>(c->value()));
}

void GaugeFamily::render(Writer& w) const {
  w.family(name_, help_, "gauge");
  for (const auto& [values, g] : snapshot()) w.sample(name_, label_names_, values, g->value());
}

HistogramFamily::HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                                 std::vector<double> bounds)
    : SeriesFamily(std::move(name), std::move(help), std::move(label_names)), bounds_(std::move(bounds)) {
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw std::invalid_argument("histogram " + name_ + ": bucket bounds must be finite and ascending");
    }
  }
}

void HistogramFamily::render(Writer& w) const {
  w.family(name_, help_, "histogram");
  for (const auto& [values, h] : snapshot())
    w.histogram(name_, label_names_, values, bounds_, h->counts(), h->sum());
}

// ---- Registry ----

template <typename F, typename... Args>
F& Registry::add(Args&&... args) {
  auto family = std::make_unique<F>(std::forward<Args>(args)...);
  F& out = *family;
  MutexLock lock(mutex_);
  for (const auto& f : families_) {
    if (f->name() == out.name()) throw std::invalid_argument("metric " + out.name() + " is registered twice");
  }
  families_.push_back(std::move(family));
  return out;
}

namespace {
void check_names(const std::string& name, const std::vector<std::string>& label_names) {
  if (!valid_metric_name(name)) throw std::invalid_argument("invalid metric name '" + name + "'");
  for (const auto& l : label_names) {
    if (!valid_label_name(l) || l == "le" || l.rfind("__", 0) == 0) {
      throw std::invalid_argument("metric " + name + ": invalid label name '" + l + "'");
    }
  }
}
}  // namespace

CounterFamily& Registry::counter(std::string name, std::string help, std::vector<std::string> label_names) {
  check_names(name, label_names);
  return add<CounterFamily>(std::move(name), std::move(help), std::move(label_names));
}

GaugeFamily& Registry::gauge(std::string name, std::string help, std::vector<std::string> label_names) {
  check_names(name, label_names);
  return add<GaugeFamily>(std::move(name), std::move(help), std::move(label_names));
}

HistogramFamily& Registry::histogram(std::string name, std::string help, std::vector<std::string> label_names,
                                     std::vector<double> bounds) {
  check_names(name, label_names);
  return add<HistogramFamily>(std::move(name), std::move(help), std::move(label_names), std::move(bounds));
}

void Registry::render(Writer& w) const {
  MutexLock lock(mutex_);
  for (const auto& f : families_) f->render(w);
}

}  // namespace metrics

// ---- Metrics ----

const std::vector<double>& Metrics::latency_buckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,    5,     10,   30,    60,   120, 300};
  return b;
}

const std::vector<double>& Metrics::per_token_buckets() {
  static const std::vector<double> b = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,   0.25,   0.5,   1,    2.5};
  return b;
}

const std::vector<double>& Metrics::age_buckets() {
  static const std::vector<double> b = {1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400, 604800};
  return b;
}

const std::vector<double>& Metrics::length_buckets() {
  static const std::vector<double> b = {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536};
  return b;
}

Metrics::Metrics()
    : requests_(registry_.counter("car_inference_requests_total",
                                  "Requests answered, by op and outcome (ok or the error code).",
                                  {"op", "outcome"})),
      http_(registry_.counter("car_inference_http_requests_total", "HTTP responses, by endpoint and status.",
                              {"endpoint", "status"})),
      queue_wait_(registry_.histogram("car_inference_request_queue_wait_seconds",
                                      "Time from receiving a load or infer request to its start on a worker.",
                                      {}, latency_buckets())),
      load_(registry_.histogram("car_inference_model_load_seconds",
                                "Time of each model load (successful or failed).", {}, latency_buckets())),
      prompt_(registry_.histogram("car_inference_prompt_seconds",
                                  "Time to process the prompt of each generation.", {}, latency_buckets())),
      decode_per_token_(registry_.histogram(
          "car_inference_decode_seconds_per_token",
          "Decode time per generated token, one observation per generation.", {}, per_token_buckets())),
      prompt_tokens_(registry_.counter("car_inference_prompt_tokens_total", "Prompt tokens processed.")),
      cached_tokens_(registry_.counter("car_inference_prompt_cached_tokens_total",
                                       "Prompt tokens taken from a sequence's KV cache, not computed.")),
      completion_tokens_(registry_.counter("car_inference_completion_tokens_total", "Tokens generated.")),
      finish_(registry_.counter("car_inference_generations_total", "Finished generations, by finish reason.",
                                {"finish_reason"})),
      eviction_age_(registry_.histogram("car_inference_cache_eviction_age_seconds",
                                        "Age (since load) of models when they left the cache, by cause.",
                                        {"cause"}, age_buckets())),
      ttft_(registry_.histogram("car_inference_time_to_first_token_seconds",
                                "Time from receiving an infer request to its first generated token, by model.",
                                {"model"}, latency_buckets())),
      itl_(registry_.histogram("car_inference_inter_token_latency_seconds",
                               "Time between consecutive generated tokens of a request, by model.", {"model"},
                               per_token_buckets())),
      prompt_length_(registry_.histogram("car_inference_prompt_length_tokens",
                                         "Prompt length of each generation, in tokens.", {}, length_buckets())),
      generation_length_(registry_.histogram("car_inference_generation_length_tokens",
                                             "Tokens generated by each generation.", {}, length_buckets())),
      queue_wait_series_(queue_wait_.with({})),
      load_series_(load_.with({})),
      prompt_series_(prompt_.with({})),
      decode_series_(decode_per_token_.with({})),
      prompt_tokens_series_(prompt_tokens_.with({})),
      cached_tokens_series_(cached_tokens_.with({})),
      completion_tokens_series_(completion_tokens_.with({})) {}

void Metrics::count_http(std::string_view endpoint, int status) {
  char buf[16];
  auto r = std::to_chars(buf, buf + sizeof buf, status);
  http_.with({endpoint, std::string_view(buf, static_cast<std::size_t>(r.ptr - buf))}).inc();
}

void Metrics::count_request(std::string_view op, std::string_view outcome) {
  // "ok(hit)", "ok(length, 5 tokens)"... are one outcome: the label's values must stay few.
  if (outcome.substr(0, 2) == "ok") outcome = "ok";
  requests_.with({op, outcome}).inc();
}

void Metrics::observe_queue_wait(double seconds) {
  queue_wait_series_.observe(seconds);
}

void Metrics::observe_load(double seconds) {
  load_series_.observe(seconds);
}

void Metrics::observe_generation(uint64_t prompt_tokens, double prompt_seconds, uint64_t completion_tokens,
                                 double decode_seconds, std::string_view finish_reason, uint64_t cached_tokens) {
  prompt_tokens_series_.inc(prompt_tokens);
  cached_tokens_series_.inc(cached_tokens);
  completion_tokens_series_.inc(completion_tokens);
  prompt_series_.observe(prompt_seconds);
  if (completion_tokens > 0) decode_series_.observe(decode_seconds / static_cast<double>(completion_tokens));
  finish_.with({finish_reason}).inc();
  prompt_length_.with({}).observe(static_cast<double>(prompt_tokens));
  generation_length_.with({}).observe(static_cast<double>(completion_tokens));
}

void Metrics::observe_first_token(std::string_view model, double seconds) {
  ttft_.with({model}).observe(seconds);
}

void Metrics::observe_inter_token(std::string_view model, const std::vector<float>& gaps_ms) {
  if (gaps_ms.empty()) return;
  metrics::Histogram& h = itl_.with({model});
  for (float g : gaps_ms) h.observe(static_cast<double>(g) / 1000.0);
}

void Metrics::observe_eviction(std::string_view cause, double age_seconds) {
  eviction_age_.with({cause}).observe(age_seconds);
}

}  // namespace car::daemon
