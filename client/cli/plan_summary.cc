#include "client/cli/plan_summary.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/lost_set.h"
#include "planner/layout.h"

namespace reshard::cli {
namespace {

// A table of left-aligned first column and right-aligned other columns.
class Table {
 public:
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  std::string Render(const std::string& indent) const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t c = 0; c < row.size(); ++c) {
        const std::string pad(width[c] - row[c].size(), ' ');
        if (c == 0) {
          absl::StrAppend(&line, row[c], pad);
        } else {
          absl::StrAppend(&line, "  ", pad, row[c]);
        }
      }
      absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

int64_t World(const v1::ParallelConfig& c) { return planner::WorldSize(c); }

// Layers per stage, e.g. "12,12" or "5,6,7,6".
std::string LayersPerStage(const v1::ParallelConfig& c, int num_layers) {
  std::vector<int64_t> starts(c.stage_starts().begin(), c.stage_starts().end());
  if (starts.empty() && c.pp() > 0) {
    const int64_t base = num_layers / c.pp(), rem = num_layers % c.pp();
    for (int64_t s = 0; s < c.pp(); ++s) starts.push_back(s * base + std::min(s, rem));
  }
  std::vector<int64_t> counts;
  for (size_t s = 0; s < starts.size(); ++s) {
    const int64_t end = s + 1 < starts.size() ? starts[s + 1] : num_layers;
    counts.push_back(end - starts[s]);
  }
  return absl::StrJoin(counts, ",");
}

std::vector<std::string> LayoutRow(const std::string& label, const v1::Layout& layout,
                                   int num_layers) {
  const v1::ParallelConfig& c = layout.config();
  return {label,
          absl::StrCat(c.tp()),
          absl::StrCat(c.pp()),
          absl::StrCat(c.dp()),
          absl::StrCat(World(c)),
          absl::StrCat(PlacementHosts(layout.placement()).size()),
          c.order() == v1::RANK_ORDER_TP_PP_DP ? "tp-pp-dp" : "tp-dp-pp",
          LayersPerStage(c, num_layers)};
}

// "0-3,7,9-10"
std::string RankRanges(const std::vector<int>& sorted) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string HostRole(const std::string& host, const absl::flat_hash_set<std::string>& old_hosts,
                     const absl::flat_hash_set<std::string>& new_hosts,
                     const absl::flat_hash_set<std::string>& lost_hosts) {
  if (lost_hosts.contains(host)) return "lost";
  const bool in_old = old_hosts.contains(host), in_new = new_hosts.contains(host);
  if (in_old && in_new) return "old+new";
  if (in_old) return "old";
  if (in_new) return "new";
  return "-";
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const bool negative = bytes < 0;
  const double magnitude = std::abs(static_cast<double>(bytes));
  if (magnitude < 1024) return absl::StrCat(bytes, " B");
  double v = magnitude;
  int unit = 0;
  while (v >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    v /= 1024;
    ++unit;
  }
  const char* sign = negative ? "-" : "";
  if (v >= 100) return absl::StrFormat("%s%.0f %s", sign, v, kUnits[unit]);
  if (v >= 10) return absl::StrFormat("%s%.1f %s", sign, v, kUnits[unit]);
  return absl::StrFormat("%s%.2f %s", sign, v, kUnits[unit]);
}

std::string FormatRatio(int64_t cross, int64_t lower_bound) {
  if (lower_bound == 0) return cross == 0 ? "n/a" : "inf";
  return absl::StrFormat("%.3f", static_cast<double>(cross) / static_cast<double>(lower_bound));
}

std::string FormatPlanSummary(const SummaryContext& context, const v1::TransferPlan& plan) {
  const v1::PlanStats& s = plan.stats();
  std::string out;
  absl::StrAppend(&out, "job \"", context.job_name, "\": ", context.spec_path, " -> ",
                  context.target_path, "\n\n");

  Table layouts;
  layouts.AddRow({"", "tp", "pp", "dp", "world", "hosts", "order", "layers/stage"});
  layouts.AddRow(LayoutRow("from", plan.source_layout(), context.num_layers));
  layouts.AddRow(LayoutRow("to", plan.target_layout(), context.num_layers));
  absl::StrAppend(&out, layouts.Render("  "), "\n");

  std::vector<int> lost_ranks(plan.lost_ranks().begin(), plan.lost_ranks().end());
  std::sort(lost_ranks.begin(), lost_ranks.end());
  if (lost_ranks.empty() && context.lost_hosts.empty()) {
    absl::StrAppend(&out, "  lost: none\n\n");
  } else {
    absl::StrAppend(&out, "  lost: ");
    if (!context.lost_hosts.empty()) {
      absl::StrAppend(&out, "hosts ", absl::StrJoin(context.lost_hosts, ","), "; ");
    }
    absl::StrAppend(&out, lost_ranks.size(), " old ranks (", RankRanges(lost_ranks),
                    ") not used as sources\n\n");
  }

  const std::vector<std::string> old_list = PlacementHosts(plan.source_layout().placement());
  const std::vector<std::string> new_list = PlacementHosts(plan.target_layout().placement());
  const absl::flat_hash_set<std::string> old_hosts(old_list.begin(), old_list.end());
  const absl::flat_hash_set<std::string> new_hosts(new_list.begin(), new_list.end());
  const absl::flat_hash_set<std::string> lost_hosts(context.lost_hosts.begin(),
                                                    context.lost_hosts.end());
  Table hosts;
  hosts.AddRow({"host", "role", "in", "out", "local"});
  for (const v1::HostTraffic& h : s.hosts()) {
    hosts.AddRow({h.host(), HostRole(h.host(), old_hosts, new_hosts, lost_hosts),
                  FormatBytes(h.bytes_in()), FormatBytes(h.bytes_out()),
                  FormatBytes(h.bytes_local())});
  }
  absl::StrAppend(&out, hosts.Render("  "), "\n");

  Table totals;
  totals.AddRow({"bytes local", FormatBytes(s.bytes_local()), absl::StrCat(s.bytes_local(), " B")});
  totals.AddRow({"bytes cross-host", FormatBytes(s.bytes_cross_host()),
                 absl::StrCat(s.bytes_cross_host(), " B")});
  totals.AddRow({"lower bound (cross-host)", FormatBytes(s.lower_bound_cross_host()),
                 absl::StrCat(s.lower_bound_cross_host(), " B")});
  totals.AddRow(
      {"cross / lower bound", FormatRatio(s.bytes_cross_host(), s.lower_bound_cross_host()), ""});
  totals.AddRow(
      {"zero-filled", FormatBytes(s.bytes_zero_filled()), absl::StrCat(s.zero_fills(), " fills")});
  totals.AddRow(
      {"steps", absl::StrCat(s.steps()), absl::StrCat(s.cross_host_steps(), " cross-host")});
  if (plan.replicas().count() > 1) {  // docs/partitioning.md, "Replicas plan alone"
    totals.AddRow({"replicas planned alone", absl::StrCat(plan.replicas().count()),
                   absl::StrCat(plan.steps_size(), " steps each")});
  }
  totals.AddRow({"plan time", absl::StrFormat("%.2f ms", context.plan_ms),
                 absl::StrFormat("+%.2f ms to TransferPlan", context.to_proto_ms)});
  absl::StrAppend(&out, totals.Render("  "));
  return out;
}

}  // namespace reshard::cli
