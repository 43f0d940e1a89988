#include "server/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

namespace vlm {

std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Shortest round-trip form: counters print as "3", not "3.000000".
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

std::string prometheus_escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string prometheus_escape_help(std::string_view v) {
  std::string out;
  for (char c : v) {
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

void Counter::inc(std::string_view label_value, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(label_value);
  if (it == values_.end()) it = values_.emplace(std::string(label_value), 0.0).first;
  it->second += v;
}

double Counter::value(std::string_view label_value) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(label_value);
  return it == values_.end() ? 0.0 : it->second;
}

void Counter::render(const std::string& name, const std::string& const_labels,
                     std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  // An unlabelled counter shows 0 before its first increment, so dashboards see
  // the series.
  if (label_name_.empty() && values_.empty()) {
    out->append(name);
    if (!const_labels.empty()) out->append("{").append(const_labels).append("}");
    out->append(" 0\n");
    return;
  }
  for (const auto& [label, v] : values_) {
    // Appends piecewise: GCC 12's -Wrestrict misfires on long operator+ chains.
    out->append(name);
    if (!label_name_.empty() || !const_labels.empty()) {
      out->append("{").append(const_labels);
      if (!label_name_.empty()) {
        if (!const_labels.empty()) out->append(",");
        out->append(label_name_).append("=\"");
        out->append(prometheus_escape_label(label)).append("\"");
      }
      out->append("}");
    }
    out->append(" ").append(prometheus_number(v)).append("\n");
  }
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  // Sorted and deduplicated here rather than rejected: bounds are code
  // constants, not input.
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  if (!bounds_.empty() && std::isinf(bounds_.back())) bounds_.pop_back();  // +Inf is implicit
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
}

void Histogram::observe(double v) {
  // First bound >= v: Prometheus buckets are "less than or equal".
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Histogram::cumulative_count(size_t i) const {
  uint64_t c = 0;
  for (size_t k = 0; k <= i && k <= bounds_.size(); ++k) {
    c += buckets_[k].load(std::memory_order_relaxed);
  }
  return c;
}

void Histogram::render(const std::string& name, const std::string& const_labels,
                       std::string* out) const {
  // Read buckets once and derive _count from them, so one scrape is
  // self-consistent even while other threads observe (the +Inf bucket must
  // equal _count).
  const std::string lead = const_labels.empty() ? "{" : "{" + const_labels + ",";
  const std::string plain = const_labels.empty() ? "" : "{" + const_labels + "}";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? prometheus_number(bounds_[i]) : "+Inf";
    out->append(name).append("_bucket").append(lead).append("le=\"").append(le).append("\"} ");
    out->append(std::to_string(cum)).append("\n");
  }
  out->append(name).append("_sum").append(plain).append(" ");
  out->append(prometheus_number(sum())).append("\n");
  out->append(name).append("_count").append(plain).append(" ");
  out->append(std::to_string(cum)).append("\n");
}

std::string prometheus_labels(
    const std::vector<std::pair<std::string_view, std::string_view>>& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out.append(k).append("=\"").append(prometheus_escape_label(v)).append("\"");
  }
  return out;
}

Counter& MetricsRegistry::counter(std::string name, std::string help, std::string label_name,
                                  std::string const_labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), std::move(help), "counter", std::move(const_labels),
          nullptr,         nullptr,         nullptr};
  e.counter = std::make_unique<Counter>(std::move(label_name));
  entries_.push_back(std::move(e));
  return *entries_.back().counter;
}

Gauge& MetricsRegistry::gauge(std::string name, std::string help, std::string const_labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), std::move(help), "gauge", std::move(const_labels),
          nullptr,         nullptr,         nullptr};
  e.gauge = std::make_unique<Gauge>();
  entries_.push_back(std::move(e));
  return *entries_.back().gauge;
}

Histogram& MetricsRegistry::histogram(std::string name, std::string help,
                                      std::vector<double> upper_bounds, std::string const_labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e{std::move(name), std::move(help), "histogram", std::move(const_labels),
          nullptr,         nullptr,         nullptr};
  e.histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  entries_.push_back(std::move(e));
  return *entries_.back().histogram;
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Entry& e : entries_) {
    out.append("# HELP ").append(e.name).append(" ").append(prometheus_escape_help(e.help));
    out.append("\n# TYPE ").append(e.name).append(" ").append(e.type).append("\n");
    if (e.counter) e.counter->render(e.name, e.labels, &out);
    if (e.gauge) {
      out.append(e.name);
      if (!e.labels.empty()) out.append("{").append(e.labels).append("}");
      out.append(" ").append(prometheus_number(e.gauge->value())) += "\n";
    }
    if (e.histogram) e.histogram->render(e.name, e.labels, &out);
  }
  return out;
}

std::map<std::string, double, std::less<>> Counter::values() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_;
}

std::string MetricsRegistry::render_json() const {
  nlohmann::json families = nlohmann::json::object();
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_) {
    nlohmann::json f = {{"type", e.type}, {"help", e.help}, {"labels", e.labels}};
    // JSON has no NaN or infinity: such a value is null.
    auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
    if (e.counter) {
      f["label_name"] = e.counter->label_name();
      nlohmann::json values = nlohmann::json::object();
      for (const auto& [k, v] : e.counter->values()) values[k] = number(v);
      if (e.counter->label_name().empty() && values.empty()) values[""] = 0;
      f["values"] = std::move(values);
    }
    if (e.gauge) f["value"] = number(e.gauge->value());
    if (e.histogram) {
      const Histogram& h = *e.histogram;
      nlohmann::json buckets = nlohmann::json::array();
      for (size_t i = 0; i <= h.bounds().size(); ++i) buckets.push_back(h.cumulative_count(i));
      f["bounds"] = h.bounds();
      f["buckets"] = std::move(buckets);
      f["count"] = h.count();
      f["sum"] = number(h.sum());
    }
    families[e.name] = std::move(f);
  }
  // Labels carry names from outside (the model folder's): bytes that are not UTF-8 are replaced.
  return nlohmann::json({{"metrics", std::move(families)}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// The whitespace-separated fields of a /proc line as numbers (NaN where one is not a number).
std::vector<double> numbers(std::string_view text) {
  std::vector<double> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    const size_t j = std::min(text.find(' ', i), text.size());
    if (j > i) {
      double v = std::numeric_limits<double>::quiet_NaN();
      const auto [ptr, ec] = std::from_chars(text.data() + i, text.data() + j, v);
      if (ec != std::errc() || ptr != text.data() + j) v = std::numeric_limits<double>::quiet_NaN();
      out.push_back(v);
    }
    i = j;
  }
  return out;
}

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

ProcessStats read_process_stats() {
  ProcessStats s;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  // /proc/self/stat: the fields after the command name (which may hold spaces and parentheses,
  // so read from its last ')'): state is field 3, utime and stime 14 and 15, starttime 22 (clock
  // ticks after boot); here field k is f[k - 3] (the state reads as NaN).
  const std::string stat = read_line("/proc/self/stat");
  const size_t close = stat.rfind(')');
  if (ticks > 0 && close != std::string::npos && close + 2 < stat.size()) {
    const std::vector<double> f = numbers(std::string_view(stat).substr(close + 2));
    if (f.size() > 19 && std::isfinite(f[11]) && std::isfinite(f[12])) {
      s.cpu_seconds = (f[11] + f[12]) / ticks;
      std::ifstream proc_stat("/proc/stat");
      std::string line;
      while (std::getline(proc_stat, line)) {
        if (line.rfind("btime ", 0) != 0) continue;
        const std::vector<double> b = numbers(std::string_view(line).substr(6));
        if (!b.empty() && std::isfinite(b[0]) && std::isfinite(f[19])) {
          s.start_time_seconds = b[0] + f[19] / ticks;
        }
        break;
      }
    }
  }
  const std::vector<double> m = numbers(read_line("/proc/self/statm"));
  if (m.size() > 1 && std::isfinite(m[1])) {
    s.resident_bytes = m[1] * static_cast<double>(sysconf(_SC_PAGESIZE));
  }
  return s;
}

}  // namespace vlm
