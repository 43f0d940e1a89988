#include "server/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace vlm {
namespace {

TEST(MetricsTest, RendersExactExpositionText) {
  MetricsRegistry reg;
  Counter& requests = reg.counter("vlm_requests_total", "Requests by outcome.", "outcome");
  Gauge& running = reg.gauge("vlm_running", "Running requests.");
  Histogram& ttft = reg.histogram("vlm_ttft_seconds", "Time to first token.", {0.25, 0.5, 1.0});
  requests.inc("ok");
  requests.inc("ok");
  requests.inc("error");
  running.set(5);
  running.dec(2);
  // Exactly representable values so the sum prints exactly; 0.25 lands in
  // le="0.25" (<=).
  for (double v : {0.125, 0.25, 0.5, 4.0}) ttft.observe(v);

  EXPECT_EQ(reg.render(),
            "# HELP vlm_requests_total Requests by outcome.\n"
            "# TYPE vlm_requests_total counter\n"
            "vlm_requests_total{outcome=\"error\"} 1\n"
            "vlm_requests_total{outcome=\"ok\"} 2\n"
            "# HELP vlm_running Running requests.\n"
            "# TYPE vlm_running gauge\n"
            "vlm_running 3\n"
            "# HELP vlm_ttft_seconds Time to first token.\n"
            "# TYPE vlm_ttft_seconds histogram\n"
            "vlm_ttft_seconds_bucket{le=\"0.25\"} 2\n"
            "vlm_ttft_seconds_bucket{le=\"0.5\"} 3\n"
            "vlm_ttft_seconds_bucket{le=\"1\"} 3\n"
            "vlm_ttft_seconds_bucket{le=\"+Inf\"} 4\n"
            "vlm_ttft_seconds_sum 4.875\n"
            "vlm_ttft_seconds_count 4\n");
}

TEST(MetricsTest, ConstantLabelsOnEverySample) {
  MetricsRegistry reg;
  const std::string labels = prometheus_labels({{"model_name", "m\"1"}, {"engine", "0"}});
  EXPECT_EQ(labels, "model_name=\"m\\\"1\",engine=\"0\"");
  reg.counter("vllm:prompt_tokens_total", "Prompt tokens.", "", labels).inc(3);
  reg.counter("vllm:request_success_total", "Finished.", "finished_reason", labels).inc("stop");
  reg.gauge("vllm:num_requests_running", "Running.", labels).set(2);
  reg.histogram("vllm:e2e_request_latency_seconds", "E2E.", {1.0}, labels).observe(0.5);
  EXPECT_EQ(reg.render(),
            "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            "vllm:prompt_tokens_total{" +
                labels +
                "} 3\n"
                "# HELP vllm:request_success_total Finished.\n"
                "# TYPE vllm:request_success_total counter\n"
                "vllm:request_success_total{" +
                labels +
                ",finished_reason=\"stop\"} 1\n"
                "# HELP vllm:num_requests_running Running.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                "vllm:num_requests_running{" +
                labels +
                "} 2\n"
                "# HELP vllm:e2e_request_latency_seconds E2E.\n"
                "# TYPE vllm:e2e_request_latency_seconds histogram\n"
                "vllm:e2e_request_latency_seconds_bucket{" +
                labels +
                ",le=\"1\"} 1\n"
                "vllm:e2e_request_latency_seconds_bucket{" +
                labels +
                ",le=\"+Inf\"} 1\n"
                "vllm:e2e_request_latency_seconds_sum{" +
                labels +
                "} 0.5\n"
                "vllm:e2e_request_latency_seconds_count{" +
                labels + "} 1\n");
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram h({1, 2, 3});
  for (double v : {0.5, 1.5, 1.7, 2.5, 9.0, 10.0}) h.observe(v);
  EXPECT_EQ(h.cumulative_count(0), 1u);
  EXPECT_EQ(h.cumulative_count(1), 3u);
  EXPECT_EQ(h.cumulative_count(2), 4u);
  EXPECT_EQ(h.cumulative_count(3), 6u);  // +Inf
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 25.2);
}

TEST(MetricsTest, UnlabelledCounterAndEscaping) {
  MetricsRegistry reg;
  reg.counter("vlm_prompt_tokens_total", "Prompt tokens.\nBack\\slash");
  Counter& c = reg.counter("vlm_odd_total", "Odd labels.", "why");
  c.inc("a\"b\\c\nd", 2.5);
  EXPECT_EQ(reg.render(),
            "# HELP vlm_prompt_tokens_total Prompt tokens.\\nBack\\\\slash\n"
            "# TYPE vlm_prompt_tokens_total counter\n"
            "vlm_prompt_tokens_total 0\n"
            "# HELP vlm_odd_total Odd labels.\n"
            "# TYPE vlm_odd_total counter\n"
            "vlm_odd_total{why=\"a\\\"b\\\\c\\nd\"} 2.5\n");
  EXPECT_EQ(prometheus_number(INFINITY), "+Inf");
  EXPECT_EQ(prometheus_number(0.1), "0.1");
  EXPECT_EQ(prometheus_number(1234567), "1234567");
}

TEST(MetricsTest, ConcurrentUpdatesSumCorrectly) {
  MetricsRegistry reg;
  Counter& c = reg.counter("c_total", "c", "outcome");
  Counter& plain = reg.counter("p_total", "p");
  Gauge& g = reg.gauge("g", "g");
  Histogram& h = reg.histogram("h", "h", {0.5});
  constexpr int kThreads = 4, kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        c.inc(t % 2 == 0 ? "ok" : "error");
        plain.inc();
        g.inc();
        h.observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(c.value("ok"), 2.0 * kIters);
  EXPECT_EQ(c.value("error"), 2.0 * kIters);
  EXPECT_EQ(plain.value(), 1.0 * kThreads * kIters);
  EXPECT_EQ(g.value(), 1.0 * kThreads * kIters);
  EXPECT_EQ(h.count(), uint64_t{kThreads} * kIters);
  EXPECT_EQ(h.cumulative_count(0), uint64_t{kThreads} * kIters / 2);
  EXPECT_DOUBLE_EQ(h.sum(), kThreads * (kIters / 2) * 1.25);
}

TEST(MetricsTest, JsonCarriesTheSameSamplesAsTheText) {
  MetricsRegistry reg;
  Counter& c = reg.counter("r_total", "By outcome.", "outcome");
  reg.counter("plain_total", "Never incremented.");
  Gauge& g = reg.gauge("g", "A gauge.", prometheus_labels({{"model_name", "m\"x"}}));
  Histogram& h = reg.histogram("h_seconds", "Latency.", {0.1, 1});
  c.inc("ok", 3);
  c.inc("cancelled");
  g.set(-1.5);
  h.observe(0.05);
  h.observe(0.5);
  h.observe(7);
  const nlohmann::json j = nlohmann::json::parse(reg.render_json())["metrics"];
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j["r_total"]["type"], "counter");
  EXPECT_EQ(j["r_total"]["label_name"], "outcome");
  EXPECT_EQ(j["r_total"]["values"], (nlohmann::json{{"ok", 3.0}, {"cancelled", 1.0}}));
  EXPECT_EQ(j["plain_total"]["values"], (nlohmann::json{{"", 0}}));
  EXPECT_EQ(j["g"]["type"], "gauge");
  EXPECT_EQ(j["g"]["value"], -1.5);
  EXPECT_EQ(j["g"]["labels"], "model_name=\"m\\\"x\"");
  EXPECT_EQ(j["h_seconds"]["bounds"], (nlohmann::json{0.1, 1.0}));
  EXPECT_EQ(j["h_seconds"]["buckets"], (nlohmann::json{1, 2, 3}));  // cumulative, then +Inf
  EXPECT_EQ(j["h_seconds"]["count"], 3);
  EXPECT_DOUBLE_EQ(j["h_seconds"]["sum"].get<double>(), 7.55);
  g.set(NAN);  // JSON has no NaN: null
  EXPECT_TRUE(nlohmann::json::parse(reg.render_json())["metrics"]["g"]["value"].is_null());
}

TEST(MetricsTest, ProcessStatsAreThisProcess) {
  const ProcessStats before = read_process_stats();
  // Burn 50 ms of CPU and touch 64 MiB, then read again.
  const std::clock_t c0 = std::clock();
  volatile double x = 0;
  while (std::clock() - c0 < CLOCKS_PER_SEC / 20) x = x + 1e-9;
  std::vector<char> block(64 << 20, 1);
  const ProcessStats after = read_process_stats();
  EXPECT_GT(after.cpu_seconds, before.cpu_seconds);
  EXPECT_GE(after.resident_bytes, before.resident_bytes + (48 << 20));
  EXPECT_EQ(block[12345], 1);
  // Started within the last hour, not in the future.
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(after.start_time_seconds, now + 1);
  EXPECT_GT(after.start_time_seconds, now - 3600);
}

}  // namespace
}  // namespace vlm
