// A tiny Prometheus registry: counters (optionally with one label), gauges and
// fixed-bucket histograms, rendered in the text exposition format 0.0.4 for GET
// /metrics.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace vlm {

// A monotonically increasing value. With a label name, each label value is its
// own series (e.g. requests by outcome); without one, use the empty label
// value.
class Counter {
 public:
  explicit Counter(std::string label_name) : label_name_(std::move(label_name)) {}
  void inc(double v = 1.0) { inc("", v); }
  void inc(std::string_view label_value, double v = 1.0);
  double value(std::string_view label_value = "") const;
  const std::string& label_name() const { return label_name_; }
  // Every series: label value -> value ("" without a label).
  std::map<std::string, double, std::less<>> values() const;
  // const_labels: labels every sample carries, rendered (`a="x",b="y"`; "" for none).
  void render(const std::string& name, const std::string& const_labels, std::string* out) const;

 private:
  std::string label_name_;
  mutable std::mutex mu_;
  std::map<std::string, double, std::less<>> values_;  // sorted: stable render order
};

// A value that goes up and down (running requests, KV blocks used).
class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void inc(double v = 1.0) { v_.fetch_add(v, std::memory_order_relaxed); }
  void dec(double v = 1.0) { v_.fetch_sub(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

// Observations counted into fixed upper bounds (seconds for latencies). Bucket
// counts are kept per bucket and made cumulative on render, so observe() is one
// atomic increment plus the sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // sorted ascending; +Inf is implicit
  void observe(double v);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  // Cumulative count of observations <= bounds()[i]; i == bounds().size() is
  // +Inf.
  uint64_t cumulative_count(size_t i) const;
  const std::vector<double>& bounds() const { return bounds_; }
  void render(const std::string& name, const std::string& const_labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (last: +Inf)
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// Owns the metrics; the references it hands out stay valid for its lifetime, so
// hot paths keep them and never touch the registry's lock. Registration and
// render() are thread-safe.
class MetricsRegistry {
 public:
  // const_labels (prometheus_labels()): labels every sample of the metric carries.
  Counter& counter(std::string name, std::string help, std::string label_name = "",
                   std::string const_labels = "");
  Gauge& gauge(std::string name, std::string help, std::string const_labels = "");
  Histogram& histogram(std::string name, std::string help, std::vector<double> upper_bounds,
                       std::string const_labels = "");
  std::string render() const;
  // The same samples as JSON, for the web dashboard: {"metrics": {name: family}}, a family being
  // {"type", "help", "labels" (the constant labels as rendered), and "values" (counter: label
  // value -> value, keyed "" without a label), "value" (gauge), or "bounds", "buckets"
  // (cumulative, the last one +Inf), "count", "sum" (histogram)}.
  std::string render_json() const;

 private:
  struct Entry {
    std::string name, help, type, labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // registration order is render order
};

// What Prometheus' client libraries export as process_* metrics, read from /proc/self (zeros
// where it cannot be read).
struct ProcessStats {
  double cpu_seconds = 0;         // user + system time
  double resident_bytes = 0;      // RSS
  double start_time_seconds = 0;  // since the Unix epoch
};
ProcessStats read_process_stats();

// Prometheus text helpers (exposed for tests): a sample value ("+Inf", "3",
// "0.25"), a label value with \\, \" and \n escaped, and a HELP text with
// \\ and \n escaped.
std::string prometheus_number(double v);
std::string prometheus_escape_label(std::string_view v);
std::string prometheus_escape_help(std::string_view v);
// Rendered labels, `a="x",b="y"`, their values escaped.
std::string prometheus_labels(
    const std::vector<std::pair<std::string_view, std::string_view>>& labels);

}  // namespace vlm
