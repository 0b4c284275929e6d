/// @file table.hpp
/// @brief What pmap-bench reports: one row per (pmap case, baseline) pair with both figures,
/// the ratio and its target, printed as a table and written as JSON; and the machine line.
///
/// Thread safety: none; used from the main thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <oneapi/tbb/version.h>
#include <spdlog/version.h>

#include "harness.hpp"

namespace pmap::report {

// ---- formatting ------------------------------------------------------------------------------

/// @brief printf into a std::string.
template <class... A>
std::string format(const char* fmt, A... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

/// @brief "850 ns", "3.21 us", "12.5 ms", "1.20 s".
inline std::string format_time(double seconds) {
  if (seconds < 0) return "-" + format_time(-seconds);
  if (seconds < 1e-6) return format("%.0f ns", seconds * 1e9);
  if (seconds < 1e-3) return format("%.3g us", seconds * 1e6);
  if (seconds < 1) return format("%.3g ms", seconds * 1e3);
  return format("%.3g s", seconds);
}

/// @brief "64 B", "256 KiB", "1 GiB" (fractions kept: "1.5 MiB").
inline std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes)) return "never";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return format("%.4g %s", bytes, units[u]);
}

/// @brief A ratio with 3 significant digits ("1.24", "0.00312").
inline std::string format_ratio(double r) { return std::isfinite(r) ? format("%.3g", r) : "-"; }

/// @brief A string as a JSON string literal.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += format("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// @brief A number as JSON (null when not finite).
inline std::string json_number(double v) {
  return std::isfinite(v) ? format("%.6g", v) : std::string("null");
}

// ---- rows ------------------------------------------------------------------------------------

/// @brief What a ratio should be: at most or at least `value` (`aim`: the stretch goal).
struct Target {
  enum Op { kNone, kAtMost, kAtLeast };
  Op op = kNone;
  double value = 0;
  double aim = 0;  ///< 0: none

  static Target at_most(double v, double aim = 0) { return {kAtMost, v, aim}; }
  static Target at_least(double v, double aim = 0) { return {kAtLeast, v, aim}; }

  bool met(double ratio) const {
    return op == kAtMost ? ratio <= value : op == kAtLeast ? ratio >= value : true;
  }
  std::string to_string() const {
    if (op == kNone) return "report";
    std::string s = format("%s %.3g", op == kAtMost ? "<=" : ">=", value);
    if (aim > 0) s += format(" (aim %.3g)", aim);
    return s;
  }
};

/// @brief One line of the report: a pmap figure next to a baseline figure.
struct Row {
  std::string workload;     ///< the workload (what --filter matches)
  std::string size;         ///< the case: size, devices, threads
  std::string pmap;         ///< the pmap variant
  std::string pmap_figure;  ///< "3.2 us", "12.1 GB/s"
  double pmap_value = 0;    ///< the figure as a number, in `unit`
  std::string baseline;     ///< the baseline's name
  std::string baseline_figure;
  double baseline_value = 0;
  std::string unit;            ///< of the values: "s", "GB/s", "GFLOP/s", "B", "fraction"
  std::string ratio_meaning;   ///< "time", "rate", ...: what the ratio divides
  Stat ratio;                  ///< median, min and max of the per-round ratios
  std::vector<double> rounds;  ///< the per-round ratios
  bool has_range = true;       ///< false when the ratio is a single derived figure
  Target target;
  double others = 0;  ///< cores' worth of CPU other processes used meanwhile

  bool has_target() const { return target.op != Target::kNone; }
  bool met() const { return target.met(ratio.median); }
};

/// @brief Builds a row comparing `candidate` with `baseline` in case `c`: by time (figures
/// in seconds per operation) or by rate (figures in `unit`, work per second times `scale`).
inline Row compare(const Case& c, const std::string& workload, const std::string& size,
                   const std::string& candidate, const std::string& baseline, Case::Metric metric,
                   Target target, const std::string& unit = "s", double scale = 1) {
  Row row;
  row.workload = workload;
  row.size = size;
  row.pmap = candidate;
  row.baseline = baseline;
  row.target = target;
  row.others = c.others();
  row.rounds = c.ratios(candidate, baseline, metric);
  row.ratio = stat(row.rounds);
  if (metric == Case::kTime) {
    row.unit = "s";
    row.ratio_meaning = "time pmap / time baseline";
    row.pmap_value = c.median_seconds(candidate);
    row.baseline_value = c.median_seconds(baseline);
    row.pmap_figure = format_time(row.pmap_value);
    row.baseline_figure = format_time(row.baseline_value);
  } else {
    row.unit = unit;
    row.ratio_meaning = "rate pmap / rate baseline";
    row.pmap_value = c.median_rate(candidate) * scale;
    row.baseline_value = c.median_rate(baseline) * scale;
    row.pmap_figure = format("%.3g %s", row.pmap_value, unit.c_str());
    row.baseline_figure = format("%.3g %s", row.baseline_value, unit.c_str());
  }
  return row;
}

/// @brief A row for what `candidate` costs beyond `floor` (the same work done by hand),
/// measured in units of `unit` (a barrier): per round (candidate - floor) / unit, by time.
inline Row excess(const Case& c, const std::string& workload, const std::string& size,
                  const std::string& candidate, const std::string& floor, const std::string& unit,
                  Target target) {
  Row row;
  row.workload = workload;
  row.size = size;
  row.pmap = candidate + " - " + floor;
  row.baseline = unit;
  row.target = target;
  row.others = c.others();
  const auto& a = c.seconds(candidate);
  const auto& f = c.seconds(floor);
  const auto& u = c.seconds(unit);
  for (std::size_t r = 0; r < a.size() && r < f.size() && r < u.size(); ++r)
    row.rounds.push_back((a[r] - f[r]) / u[r]);
  row.ratio = stat(row.rounds);
  row.unit = "s";
  row.ratio_meaning = "(time pmap - time floor) / time baseline";
  row.pmap_value = c.median_seconds(candidate) - c.median_seconds(floor);
  row.baseline_value = c.median_seconds(unit);
  row.pmap_figure = format_time(row.pmap_value);
  row.baseline_figure = format_time(row.baseline_value);
  return row;
}

// ---- machine ---------------------------------------------------------------------------------

/// @brief What the numbers were measured on.
struct Machine {
  std::string cpu;
  int cores = 0;    ///< physical cores
  int threads = 0;  ///< hardware threads
  int devices = 0;  ///< pmap::device_count()
  std::string compiler, tbb, eigen, spdlog, date;
  double load = -1;  ///< 1-minute load average at the start: others' work on a shared machine

  /// @brief Reads /proc/cpuinfo and the library versions; `devices` from the caller.
  static Machine describe(int devices) {
    Machine m;
    m.devices = devices;
    const unsigned hw = std::thread::hardware_concurrency();
    m.threads = hw == 0 ? 1 : static_cast<int>(hw);
    std::ifstream in("/proc/cpuinfo");
    std::set<std::pair<std::string, std::string>> cores;
    std::string line, physical = "0";
    auto value = [](const std::string& l) {
      const auto colon = l.find(':');
      if (colon == std::string::npos) return std::string();
      const auto begin = l.find_first_not_of(" \t", colon + 1);
      return begin == std::string::npos ? std::string() : l.substr(begin);
    };
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) == 0 && m.cpu.empty()) m.cpu = value(line);
      if (line.rfind("physical id", 0) == 0) physical = value(line);
      if (line.rfind("core id", 0) == 0) cores.emplace(physical, value(line));
    }
    if (m.cpu.empty()) m.cpu = "unknown CPU";
    m.cores = cores.empty() ? m.threads : static_cast<int>(cores.size());
#if defined(__clang__)
    m.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    m.compiler = std::string("g++ ") + __VERSION__;
#else
    m.compiler = __VERSION__;
#endif
    m.tbb = std::string("oneTBB ") + TBB_VERSION_STRING;
    m.eigen =
        format("Eigen %d.%d.%d", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
    m.spdlog = format("spdlog %d.%d.%d", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&now));
    m.date = date;
    std::ifstream("/proc/loadavg") >> m.load;
    return m;
  }

  std::string line() const {
    return format("machine: %s, %d cores, %d threads, %d devices | ", cpu.c_str(), cores, threads,
                  devices) +
           compiler + " | " + tbb + " | " + eigen + " | " + spdlog + " | " + date +
           format(" | load %.2f", load);
  }
};

// ---- the report ------------------------------------------------------------------------------

/// @brief Above this many cores' worth of other processes' CPU, a row is flagged as noisy.
inline constexpr double kNoisy = 0.2;

/// @brief The rows of a run, printed as a table and written as JSON.
class Report {
 public:
  explicit Report(Machine machine) : machine_(std::move(machine)) {}

  void add(Row row) { rows_.push_back(std::move(row)); }
  /// @brief Adds a raw JSON member to the top-level object (`"name": json`).
  void add_json(const std::string& name, std::string json) {
    extra_.emplace_back(name, std::move(json));
  }
  const std::vector<Row>& rows() const { return rows_; }
  const Machine& machine() const { return machine_; }

  int targets() const {
    return static_cast<int>(
        std::count_if(rows_.begin(), rows_.end(), [](const Row& r) { return r.has_target(); }));
  }
  int met() const {
    return static_cast<int>(std::count_if(rows_.begin(), rows_.end(),
                                          [](const Row& r) { return r.has_target() && r.met(); }));
  }

  /// @brief The table, then "targets met: X of Y".
  void print(std::FILE* out) const {
    bool noisy = false;
    const char* fmt = "%-16s %-34s %-24s %-26s %8s %-17s %-16s %s\n";
    std::fprintf(out, fmt, "workload", "size", "pmap", "baseline", "ratio", "[min, max]", "target",
                 "result");
    std::string last;
    for (const Row& r : rows_) {
      if (!last.empty() && r.workload != last) std::fputc('\n', out);
      last = r.workload;
      const std::string range =
          r.has_range ? "[" + format_ratio(r.ratio.min) + ", " + format_ratio(r.ratio.max) + "]"
                      : "";
      std::fprintf(
          out, fmt, r.workload.c_str(), r.size.c_str(), (r.pmap + " " + r.pmap_figure).c_str(),
          (r.baseline + " " + r.baseline_figure).c_str(), format_ratio(r.ratio.median).c_str(),
          range.c_str(), r.target.to_string().c_str(),
          ((r.has_target() ? (r.met() ? "met" : "MISSED") : "-") +
           std::string(r.others > kNoisy ? " *" : ""))
              .c_str());
      noisy = noisy || r.others > kNoisy;
    }
    if (noisy)
      std::fprintf(out, "\n* measured while other processes used more than %.1f cores: noisy\n",
                   kNoisy);
    std::fprintf(out, "\ntargets met: %d of %d\n", met(), targets());
  }

  /// @brief Writes the machine, the options, the rows and the extra members as JSON.
  bool write_json(const std::string& path, const std::string& options_json) const {
    std::ostringstream o;
    const Machine& m = machine_;
    o << "{\n  \"machine\": {\"line\": " << json_string(m.line())
      << ", \"cpu\": " << json_string(m.cpu) << ", \"cores\": " << m.cores
      << ", \"threads\": " << m.threads << ", \"devices\": " << m.devices
      << ", \"compiler\": " << json_string(m.compiler) << ", \"tbb\": " << json_string(m.tbb)
      << ", \"eigen\": " << json_string(m.eigen) << ", \"spdlog\": " << json_string(m.spdlog)
      << ", \"date\": " << json_string(m.date) << ", \"load\": " << json_number(m.load)
      << "},\n  \"options\": " << options_json << ",\n  \"rows\": [";
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      const char* op = r.target.op == Target::kAtMost    ? "<="
                       : r.target.op == Target::kAtLeast ? ">="
                                                         : "";
      o << (i ? ",\n" : "\n") << "    {\"workload\": " << json_string(r.workload)
        << ", \"size\": " << json_string(r.size) << ", \"pmap\": " << json_string(r.pmap)
        << ", \"pmap_value\": " << json_number(r.pmap_value)
        << ", \"pmap_figure\": " << json_string(r.pmap_figure)
        << ", \"baseline\": " << json_string(r.baseline)
        << ", \"baseline_value\": " << json_number(r.baseline_value)
        << ", \"baseline_figure\": " << json_string(r.baseline_figure)
        << ", \"unit\": " << json_string(r.unit)
        << ", \"ratio_meaning\": " << json_string(r.ratio_meaning)
        << ", \"others\": " << json_number(r.others)
        << ", \"ratio\": " << json_number(r.ratio.median)
        << ", \"ratio_min\": " << json_number(r.has_range ? r.ratio.min : r.ratio.median)
        << ", \"ratio_max\": " << json_number(r.has_range ? r.ratio.max : r.ratio.median)
        << ", \"rounds\": [";
      for (std::size_t k = 0; k < r.rounds.size(); ++k)
        o << (k ? ", " : "") << json_number(r.rounds[k]);
      o << "], \"target_op\": " << json_string(op)
        << ", \"target\": " << (r.has_target() ? json_number(r.target.value) : "null")
        << ", \"aim\": " << (r.target.aim > 0 ? json_number(r.target.aim) : "null")
        << ", \"met\": " << (r.has_target() ? (r.met() ? "true" : "false") : "null") << "}";
    }
    o << "\n  ],\n  \"targets\": {\"met\": " << met() << ", \"total\": " << targets() << "}";
    for (const auto& [name, json] : extra_) o << ",\n  " << json_string(name) << ": " << json;
    o << "\n}\n";
    std::ofstream file(path);
    file << o.str();
    return static_cast<bool>(file);
  }

 private:
  Machine machine_;
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::string>> extra_;
};

}  // namespace pmap::report
