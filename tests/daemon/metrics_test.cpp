// The metrics registry and its exposition text (daemon/metrics.h): escaping, value formatting, cumulative
// histogram buckets, counters that only go up, name checks, and concurrent recording.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "daemon/metrics.h"

namespace car::daemon {
namespace {

using metrics::Registry;
using metrics::Writer;

std::string render(const Registry& r) {
  Writer w;
  r.render(w);
  return w.take();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(MetricsFormat, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(metrics::escape_label_value("plain"), "plain");
  EXPECT_EQ(metrics::escape_label_value("a\\b"), "a\\\\b");
  EXPECT_EQ(metrics::escape_label_value("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(metrics::escape_label_value("two\nlines"), "two\\nlines");
  EXPECT_EQ(metrics::escape_label_value("\\\"\n"), "\\\\\\\"\\n");
  // Valid UTF-8 passes; invalid bytes become U+FFFD, one each.
  EXPECT_EQ(metrics::escape_label_value("qwen3-\xC3\xA9"), "qwen3-\xC3\xA9");
  EXPECT_EQ(metrics::escape_label_value("a\xFF"
                                        "b\xC3"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(metrics::escape_label_value("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD")
      << "a UTF-16 surrogate is not UTF-8";
}

TEST(MetricsFormat, HelpEscapesBackslashAndNewlineOnly) {
  EXPECT_EQ(metrics::escape_help("a \"quoted\" \\ word\nnext"), "a \"quoted\" \\\\ word\\nnext");
}

TEST(MetricsFormat, ValuesAreIntegersShortestFloatsOrSpecials) {
  EXPECT_EQ(metrics::format_value(0), "0");
  EXPECT_EQ(metrics::format_value(42), "42");
  EXPECT_EQ(metrics::format_value(-3), "-3");
  EXPECT_EQ(metrics::format_value(0.25), "0.25");
  EXPECT_EQ(metrics::format_value(0.1), "0.1");
  EXPECT_EQ(metrics::format_value(1e300), "1e+300");
  EXPECT_EQ(metrics::format_value(1.5e-7), "1.5e-07");
  EXPECT_EQ(metrics::format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(metrics::format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(metrics::format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(MetricsFormat, CounterFamilyWritesHelpTypeAndEscapedLabels) {
  Registry r;
  auto& c = r.counter("t_requests_total", "Requests\nby op.", {"op", "model"});
  c.with({"infer", "a\"b"}).inc(2);
  c.with({"load", "x\\y\nz"}).inc();
  c.with({"infer", "a\"b"}).inc();
  EXPECT_EQ(render(r),
            "# HELP t_requests_total Requests\\nby op.\n"
            "# TYPE t_requests_total counter\n"
            "t_requests_total{op=\"infer\",model=\"a\\\"b\"} 3\n"
            "t_requests_total{op=\"load\",model=\"x\\\\y\\nz\"} 1\n");
}

TEST(MetricsFormat, CountersOnlyGoUp) {
  Registry r;
  auto& c = r.counter("t_total", "t").with({});
  EXPECT_EQ(c.value(), 0u);
  uint64_t last = 0;
  for (uint64_t n : {0u, 1u, 5u, 0u, 7u}) {
    c.inc(n);
    EXPECT_GE(c.value(), last);
    last = c.value();
  }
  EXPECT_EQ(c.value(), 13u);
}

TEST(MetricsFormat, GaugesGoBothWays) {
  Registry r;
  auto& g = r.gauge("t_gauge", "g", {"k"});
  g.with({"v"}).set(5);
  g.with({"v"}).add(-7.5);
  EXPECT_EQ(render(r), "# HELP t_gauge g\n# TYPE t_gauge gauge\nt_gauge{k=\"v\"} -2.5\n");
}

TEST(MetricsFormat, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry r;
  auto& h = r.histogram("t_seconds", "latency", {"op"}, {0.25, 1, 10});
  auto& s = h.with({"infer"});
  for (double v : {0.125, 0.25, 0.5, 0.75, 3.0, 100.0}) s.observe(v);
  EXPECT_EQ(render(r),
            "# HELP t_seconds latency\n"
            "# TYPE t_seconds histogram\n"
            "t_seconds_bucket{op=\"infer\",le=\"0.25\"} 2\n"  // 0.25 itself counts as <= 0.25
            "t_seconds_bucket{op=\"infer\",le=\"1\"} 4\n"
            "t_seconds_bucket{op=\"infer\",le=\"10\"} 5\n"
            "t_seconds_bucket{op=\"infer\",le=\"+Inf\"} 6\n"
            "t_seconds_sum{op=\"infer\"} 104.625\n"
            "t_seconds_count{op=\"infer\"} 6\n");
  EXPECT_EQ(s.count(), 6u);
}

TEST(MetricsFormat, HistogramWithoutLabelsAndWithoutObservations) {
  Registry r;
  auto& h = r.histogram("t_empty_seconds", "e", {}, {1, 2});
  h.with({});
  EXPECT_EQ(render(r),
            "# HELP t_empty_seconds e\n# TYPE t_empty_seconds histogram\n"
            "t_empty_seconds_bucket{le=\"1\"} 0\nt_empty_seconds_bucket{le=\"2\"} 0\n"
            "t_empty_seconds_bucket{le=\"+Inf\"} 0\nt_empty_seconds_sum 0\nt_empty_seconds_count 0\n");
}

TEST(MetricsFormat, BadNamesAndBoundsAreRefused) {
  Registry r;
  EXPECT_THROW(r.counter("1bad_total", "x"), std::invalid_argument);
  EXPECT_THROW(r.counter("bad-name_total", "x"), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "x", {"le"}), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "x", {"__reserved"}), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "x", {"has:colon"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h_seconds", "x", {}, {1, 1}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h_seconds", "x", {}, {2, 1}), std::invalid_argument);
  r.counter("dup_total", "x");
  EXPECT_THROW(r.gauge("dup_total", "x"), std::invalid_argument);
  EXPECT_TRUE(metrics::valid_metric_name("ns:sub_total"));
  EXPECT_FALSE(metrics::valid_label_name("ns:sub"));
}

TEST(MetricsFormat, ConcurrentRecordingLosesNothing) {
  Registry r;
  auto& c = r.counter("t_total", "t", {"k"});
  auto& h = r.histogram("t_seconds", "t", {}, {0.5});
  auto& hs = h.with({});
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        c.with({t % 2 == 0 ? "even" : "odd"}).inc();
        hs.observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.with({"even"}).value() + c.with({"odd"}).value(), uint64_t{kThreads} * kEach);
  const auto counts = hs.counts();
  EXPECT_EQ(counts[0], uint64_t{kThreads} * kEach / 2);
  EXPECT_EQ(counts[1], uint64_t{kThreads} * kEach / 2);
  EXPECT_DOUBLE_EQ(hs.sum(), kThreads * (kEach / 2) * 1.25);
}

TEST(DaemonMetrics, RequestOutcomesCollapseToOkOrTheErrorCode) {
  Metrics m;
  m.count_request("load", "ok(hit)");
  m.count_request("infer", "ok(length, 5 tokens)");
  m.count_request("infer", "ok(stop, 1 tokens)");
  m.count_request("infer", "busy");
  m.count_http("/v1/models", 200);
  m.count_http("/v1/models", 200);
  m.count_http("other", 404);
  Writer w;
  m.render(w);
  const auto lines = lines_of(w.text());
  auto has = [&](const std::string& l) { return std::find(lines.begin(), lines.end(), l) != lines.end(); };
  EXPECT_TRUE(has("car_inference_requests_total{op=\"load\",outcome=\"ok\"} 1")) << w.text();
  EXPECT_TRUE(has("car_inference_requests_total{op=\"infer\",outcome=\"ok\"} 2")) << w.text();
  EXPECT_TRUE(has("car_inference_requests_total{op=\"infer\",outcome=\"busy\"} 1")) << w.text();
  EXPECT_TRUE(has("car_inference_http_requests_total{endpoint=\"/v1/models\",status=\"200\"} 2")) << w.text();
  EXPECT_TRUE(has("car_inference_http_requests_total{endpoint=\"other\",status=\"404\"} 1")) << w.text();
}

TEST(DaemonMetrics, GenerationsCountTokensAndObservePerTokenDecodeTime) {
  Metrics m;
  m.observe_generation(7, 0.02, 4, 0.2, "length", 5);  // 50 ms per token; 5 prompt tokens from the cache
  m.observe_generation(3, 0.01, 0, 0, "stop", 0);      // no tokens: no per-token observation
  Writer w;
  m.render(w);
  const auto lines = lines_of(w.text());
  auto has = [&](const std::string& l) { return std::find(lines.begin(), lines.end(), l) != lines.end(); };
  EXPECT_TRUE(has("car_inference_prompt_tokens_total 10")) << w.text();
  EXPECT_TRUE(has("car_inference_completion_tokens_total 4")) << w.text();
  EXPECT_TRUE(has("car_inference_prompt_cached_tokens_total 5")) << w.text();
  EXPECT_TRUE(has("car_inference_generations_total{finish_reason=\"length\"} 1")) << w.text();
  EXPECT_TRUE(has("car_inference_generations_total{finish_reason=\"stop\"} 1")) << w.text();
  EXPECT_TRUE(has("car_inference_decode_seconds_per_token_count 1")) << w.text();
  EXPECT_TRUE(has("car_inference_decode_seconds_per_token_bucket{le=\"0.025\"} 0")) << w.text();
  EXPECT_TRUE(has("car_inference_decode_seconds_per_token_bucket{le=\"0.05\"} 1")) << w.text();
  EXPECT_TRUE(has("car_inference_prompt_seconds_count 2")) << w.text();
}

}  // namespace
}  // namespace car::daemon
