#include "client/cli/server_format.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/cli/lost_set.h"
#include "client/cli/plan_summary.h"
#include "common/rpc/enum_name.h"
#include "google/protobuf/util/json_util.h"
#include "planner/layout.h"

namespace reshard::cli {
namespace {

// Left-aligned columns separated by two spaces; the first row is the header.
std::string RenderTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c], std::string(width[c] - row[c].size() + 2, ' '));
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

int64_t World(const v1::ParallelConfig& c) { return planner::WorldSize(c); }

void Field(std::string* out, absl::string_view name, absl::string_view value) {
  absl::StrAppendFormat(out, "%-19s %s\n", absl::StrCat(name, ":"), value);
}

}  // namespace

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("printing ", message.GetDescriptor()->full_name(),
                                            " as JSON: ", std::string(status.message())));
  }
  if (json.empty() || json.back() != '\n') json.push_back('\n');
  return json;
}

std::string FormatLayout(const v1::Layout& layout) {
  const v1::ParallelConfig& c = layout.config();
  std::string out =
      absl::StrFormat("tp %d, pp %d, dp %d (%d ranks)", c.tp(), c.pp(), c.dp(), World(c));
  const v1::Placement& p = layout.placement();
  if (p.ranks_size() == 0 && p.hosts_size() > 0) {
    absl::StrAppend(&out, " on ", absl::StrJoin(p.hosts(), ", "), " x ", p.devices_per_host());
  } else if (p.ranks_size() > 0) {
    absl::StrAppend(&out, " on ", absl::StrJoin(PlacementHosts(p), ", "));
  }
  return out;
}

std::string FormatRelativeTime(int64_t unix_ms, int64_t now_unix_ms) {
  if (unix_ms <= 0) return "-";
  const double d = (now_unix_ms - unix_ms) / 1000.0;
  if (d >= 0) return absl::StrCat(FormatSeconds(d), " ago");
  return absl::StrCat("in ", FormatSeconds(-d));
}

std::string FormatJobsTable(const v1::ListJobsResponse& jobs) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "TENANT", "STATE", "GEN", "TP", "PP", "DP", "RANKS", "SIZE", "OPERATION"}};
  for (const v1::Job& j : jobs.jobs()) {
    const v1::ParallelConfig& c = j.layout().config();
    rows.push_back({j.id(), j.name(), j.tenant(), rpc::EnumShortName(j.state()),
                    absl::StrCat(j.generation()), absl::StrCat(c.tp()), absl::StrCat(c.pp()),
                    absl::StrCat(c.dp()), absl::StrCat(World(c)), FormatBytes(j.total_bytes()),
                    j.active_operation_id().empty() ? "-" : j.active_operation_id()});
  }
  std::string out = RenderTable(rows);
  if (jobs.jobs().empty()) absl::StrAppend(&out, "(no jobs)\n");
  return out;
}

std::string FormatJob(const v1::Job& job, int64_t now_unix_ms) {
  std::string out;
  Field(&out, "id", job.id());
  Field(&out, "name", job.name());
  Field(&out, "tenant", job.tenant());
  Field(&out, "state", rpc::EnumShortName(job.state()));
  Field(&out, "generation", absl::StrCat(job.generation()));
  Field(&out, "layout", FormatLayout(job.layout()));
  Field(&out, "tensors", absl::StrCat(job.tensor_count()));
  Field(&out, "size", FormatBytes(job.total_bytes()));
  // UNSPECIFIED: a coordinator from before JobSpec.state_memory, whose jobs
  // all keep host state.
  Field(&out, "state memory", job.state_memory() == v1::STATE_MEMORY_DEVICE ? "device" : "host");
  Field(&out, "active operation",
        job.active_operation_id().empty() ? "-" : job.active_operation_id());
  Field(&out, "lost hosts", job.lost_hosts().empty() ? "-" : absl::StrJoin(job.lost_hosts(), ", "));
  Field(&out, "created", FormatRelativeTime(job.created_unix_ms(), now_unix_ms));
  Field(&out, "updated", FormatRelativeTime(job.updated_unix_ms(), now_unix_ms));
  if (job.has_policy()) {
    // docs/scheduler.md, "Elastic policies".
    const v1::ElasticPolicy& p = job.policy();
    std::vector<std::string> what;
    if (p.heal()) what.push_back("heal");
    if (p.grow()) {
      what.push_back(
          absl::StrCat("grow ", p.grow_at() == v1::ElasticPolicy::GROW_STOP_FREE ? "stop-free"
                                : p.grow_at() == v1::ElasticPolicy::GROW_NOW ? "now"
                                                                             : "at step boundary"));
    }
    if (p.min_devices() > 0) what.push_back(absl::StrCat("min ", p.min_devices()));
    if (p.max_devices() > 0) what.push_back(absl::StrCat("max ", p.max_devices()));
    if (!p.spare_hosts().empty()) {
      what.push_back(absl::StrCat("spares ", absl::StrJoin(p.spare_hosts(), ",")));
    }
    if (!p.allowed().empty()) {
      std::vector<std::string> configs;
      for (const v1::ParallelConfig& c : p.allowed()) {
        configs.push_back(absl::StrCat("tp", c.tp(), " pp", c.pp(), " dp", c.dp()));
      }
      what.push_back(absl::StrCat("allowed ", absl::StrJoin(configs, " | ")));
    }
    if (p.has_advise()) {
      what.push_back(absl::StrCat("as the advisor recommends (horizon ",
                                  p.advise().horizon_s() > 0 ? p.advise().horizon_s() : 3600,
                                  " s)"));
    }
    Field(&out, "policy", what.empty() ? "(does nothing)" : absl::StrJoin(what, ", "));
    Field(&out, "policy status", job.policy_status().empty() ? "-" : job.policy_status());
  }
  // Ranks per host, in rank order.
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(job.layout().placement());
  if (!slots.empty()) {
    absl::StrAppend(&out, "placement:\n");
    std::vector<std::vector<std::string>> rows = {{"  HOST", "RANKS", "DEVICES"}};
    for (const std::string& host : PlacementHosts(job.layout().placement())) {
      std::vector<std::string> ranks, devices;
      for (size_t r = 0; r < slots.size(); ++r) {
        if (slots[r].host() != host) continue;
        ranks.push_back(absl::StrCat(r));
        devices.push_back(absl::StrCat(slots[r].device()));
      }
      const bool lost = std::find(job.lost_hosts().begin(), job.lost_hosts().end(), host) !=
                        job.lost_hosts().end();
      rows.push_back({absl::StrCat("  ", host, lost ? " (LOST)" : ""), absl::StrJoin(ranks, ","),
                      absl::StrJoin(devices, ",")});
    }
    absl::StrAppend(&out, RenderTable(rows));
  }
  return out;
}

std::string FormatHostsTable(const v1::ListHostsResponse& hosts, int64_t now_unix_ms) {
  std::vector<std::vector<std::string>> rows = {
      {"HOST", "STATE", "ADDRESS", "DEVICES", "TRANSPORTS", "HEARTBEAT", "LEASE", "LEAVES"}};
  for (const v1::Host& h : hosts.hosts()) {
    std::string lease = FormatRelativeTime(h.lease_expires_unix_ms(), now_unix_ms);
    if (h.lease_expires_unix_ms() > 0 && h.lease_expires_unix_ms() <= now_unix_ms) {
      lease = absl::StrCat("expired ", lease);
    }
    rows.push_back({h.host_id(), rpc::EnumShortName(h.state()),
                    h.address().empty() ? "-" : h.address(), absl::StrCat(h.devices_size()),
                    h.transports().empty() ? "-" : absl::StrJoin(h.transports(), ","),
                    FormatRelativeTime(h.last_heartbeat_unix_ms(), now_unix_ms), lease,
                    h.leaves_unix_ms() == 0 ? std::string("-")
                                            : FormatRelativeTime(h.leaves_unix_ms(), now_unix_ms)});
  }
  std::string out = RenderTable(rows);
  if (hosts.hosts().empty()) absl::StrAppend(&out, "(no hosts)\n");
  return out;
}

std::string FormatAuditTable(const v1::ListAuditResponse& audit) {
  constexpr size_t kMessageChars = 80;
  auto dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  std::vector<std::vector<std::string>> rows = {{"TIME", "IDENTITY", "ROLE", "TENANT", "METHOD",
                                                 "JOB", "OPERATION", "TARGET", "CODE", "MESSAGE"}};
  for (const v1::AuditEntry& e : audit.entries()) {
    std::string message = e.message();
    if (message.size() > kMessageChars) {
      size_t end = kMessageChars - 3;  // not inside a UTF-8 sequence
      while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
      message = message.substr(0, end) + "...";
    }
    rows.push_back({absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(e.unix_ms()),
                                     absl::UTCTimeZone()),
                    dash(e.identity()), dash(e.role()), dash(e.tenant()), e.method(),
                    dash(e.job_id()), dash(e.operation_id()), dash(e.target()), e.code(),
                    dash(message)});
  }
  std::string out = RenderTable(rows);
  if (audit.entries().empty()) absl::StrAppend(&out, "(no audit entries)\n");
  return out;
}

namespace {

std::string Secs(double s) { return absl::StrFormat("%.2fs", s); }

std::string PredictionLine(const v1::CostPrediction& p) {
  std::string line = absl::StrCat(Secs(p.seconds()), p.calibrated() ? "" : " (seeded rates)");
  if (!p.critical_host().empty()) {
    absl::StrAppend(&line, ", critical host ", p.critical_host());
    if (!p.critical_link().empty()) absl::StrAppend(&line, " (link ", p.critical_link(), ")");
  }
  return line;
}

}  // namespace

std::string FormatHostNotice(const v1::NoticeHostResponse& notice) {
  std::vector<std::vector<std::string>> rows = {{"JOB", "OPERATION", "PREDICTED", "TARGET"}};
  std::string refusals;
  for (const v1::HostNoticeJob& j : notice.jobs()) {
    if (j.operation_id().empty()) {
      rows.push_back({j.job_id(), "-", "-", "not moved (below)"});
      absl::StrAppend(&refusals, j.job_id(), ": ", j.refused(), "\n");
    } else {
      rows.push_back(
          {j.job_id(), j.operation_id(), PredictionLine(j.prediction()), FormatLayout(j.target())});
    }
  }
  if (notice.jobs().empty()) return "(no job has ranks on the host)\n";
  return RenderTable(rows) + refusals;
}

std::string FormatOperation(const v1::Operation& op, int64_t now_unix_ms) {
  std::string out;
  Field(&out, "id", op.id());
  Field(&out, "job", op.job_id());
  Field(&out, "kind", rpc::EnumShortName(op.kind()));
  Field(&out, "state", rpc::EnumShortName(op.state()));
  Field(&out, "generation", absl::StrCat(op.from_generation(), " -> ", op.to_generation()));
  if (op.has_target_layout()) Field(&out, "target", FormatLayout(op.target_layout()));
  const double pct = op.bytes_total() > 0 ? 100.0 * op.bytes_done() / op.bytes_total() : 0;
  Field(&out, "progress",
        absl::StrFormat("%s / %s (%.1f%%)", FormatBytes(op.bytes_done()),
                        FormatBytes(op.bytes_total()), op.bytes_total() > 0 ? pct : 0.0));
  if (op.has_stats()) {
    Field(&out, "bytes local", FormatBytes(op.stats().bytes_local()));
    Field(&out, "bytes cross-host",
          absl::StrCat(FormatBytes(op.stats().bytes_cross_host()), " (lower bound ",
                       FormatBytes(op.stats().lower_bound_cross_host()), ")"));
  }
  if (op.has_prediction()) {
    // docs/scheduler.md, "The cost of an operation".
    Field(&out, "predicted", PredictionLine(op.prediction()));
    Field(&out, "actual",
          op.actual_seconds() > 0
              ? absl::StrFormat("%.2fs (planned -> %s), %.2fx the prediction", op.actual_seconds(),
                                op.stop_free() ? "agents prepared" : "committed",
                                op.prediction().seconds() > 0
                                    ? op.actual_seconds() / op.prediction().seconds()
                                    : 0.0)
              : "-");
  }
  if (op.has_deadline()) {
    // docs/scheduler.md, "Deadlines".
    Field(&out, "deadline",
          absl::StrCat(FormatRelativeTime(op.deadline().unix_ms(), now_unix_ms),
                       op.deadline().abort_past() ? " (aborts past it)" : " (goes on past it)"));
  }
  if (op.eta_unix_ms() > 0) Field(&out, "eta", FormatRelativeTime(op.eta_unix_ms(), now_unix_ms));
  if (op.stop_free()) {
    // The two phases (docs/coordinator.md, "Stop-free reconfiguration").
    Field(&out, "stop-free", "yes");
    // Prepared = the new workers (mark-prepared) and the agents (their
    // pre-copy; docs/coordinator.md, "Agents prepare").
    const bool prepared = op.prepared_unix_ms() > 0;
    std::vector<std::string> waiting;
    if (op.workers_prepared_unix_ms() == 0) waiting.push_back("mark-prepared");
    if (op.agents_prepared_unix_ms() == 0) waiting.push_back("the agents");
    Field(&out, "prepared",
          prepared ? FormatRelativeTime(op.prepared_unix_ms(), now_unix_ms)
                   : absl::StrCat("- (waiting for ", absl::StrJoin(waiting, " and "), ")"));
    Field(&out, "workers prepared",
          op.workers_prepared_unix_ms() > 0
              ? FormatRelativeTime(op.workers_prepared_unix_ms(), now_unix_ms)
              : "-");
    Field(&out, "agents prepared",
          op.agents_prepared_unix_ms() > 0
              ? FormatRelativeTime(op.agents_prepared_unix_ms(), now_unix_ms)
              : "-");
    if (op.prepared_from_generation() > 0) {
      Field(&out, "pre-copied",
            absl::StrCat(FormatBytes(op.bytes_precopied()), " from generation ",
                         op.prepared_from_generation()));
      Field(&out, "skipped unchanged",
            op.cutover_unix_ms() > 0 && op.state() != v1::OPERATION_STATE_PLANNED
                ? absl::StrCat(FormatBytes(op.bytes_skipped_unchanged()),
                               " (not moved again at the cut-over)")
                : "-");
    }
    Field(&out, "prepare",
          prepared ? absl::StrFormat("%.3fs (created -> prepared)", op.prepare_seconds()) : "-");
    Field(&out, "cut over",
          op.cutover_unix_ms() > 0
              ? absl::StrCat(FormatRelativeTime(op.cutover_unix_ms(), now_unix_ms),
                             " by checkpoint ", op.cutover_operation_id())
              : "- (waiting for the job's cut-over checkpoint)");
    Field(&out, "pause",
          op.state() == v1::OPERATION_STATE_COMMITTED
              ? absl::StrFormat("%.3fs (cut-over -> commit)", op.pause_seconds())
              : "-");
  }
  if (!op.error().empty()) Field(&out, "error", op.error());
  // Each host's task and the route its agent took (docs/coordinator.md, "The
  // route of each host's task"): "host h1: DONE 2.00 MiB / 2.00 MiB, route
  // host-staged (why)".
  for (const v1::OperationHost& h : op.hosts()) {
    std::string line =
        absl::StrCat(rpc::EnumShortName(h.state()), " ", FormatBytes(h.bytes_done()), " / ",
                     FormatBytes(h.bytes_total()), ", route ", h.route().empty() ? "-" : h.route());
    if (!h.route_reason().empty()) absl::StrAppend(&line, " (", h.route_reason(), ")");
    if (!h.waiting_on().empty()) absl::StrAppend(&line, ", waiting on ", h.waiting_on());
    if (!h.error().empty()) absl::StrAppend(&line, ", error: ", h.error());
    Field(&out, absl::StrCat("host ", h.host_id()), line);
  }
  Field(&out, "created", FormatRelativeTime(op.created_unix_ms(), now_unix_ms));
  Field(&out, "updated", FormatRelativeTime(op.updated_unix_ms(), now_unix_ms));
  return out;
}

std::string FormatPlanStats(const v1::PlanStats& s) {
  std::string out;
  Field(&out, "bytes local", FormatBytes(s.bytes_local()));
  Field(&out, "bytes cross-host", FormatBytes(s.bytes_cross_host()));
  Field(&out, "lower bound", FormatBytes(s.lower_bound_cross_host()));
  Field(&out, "cross / lower bound", FormatRatio(s.bytes_cross_host(), s.lower_bound_cross_host()));
  Field(&out, "bytes zero-filled", FormatBytes(s.bytes_zero_filled()));
  Field(&out, "steps", absl::StrCat(s.steps(), " (", s.cross_host_steps(), " cross-host)"));
  if (!s.hosts().empty()) {
    std::vector<std::vector<std::string>> rows = {{"HOST", "IN", "OUT", "LOCAL"}};
    for (const v1::HostTraffic& h : s.hosts()) {
      rows.push_back({h.host(), FormatBytes(h.bytes_in()), FormatBytes(h.bytes_out()),
                      FormatBytes(h.bytes_local())});
    }
    absl::StrAppend(&out, "\n", RenderTable(rows));
  }
  return out;
}

std::string FormatCostPrediction(const v1::CostPrediction& p) {
  std::string out;
  Field(&out, "predicted", PredictionLine(p));
  Field(&out, "overhead", Secs(p.overhead_seconds()));
  Field(
      &out, "plan bound",
      p.bound_host().empty() ? "-" : absl::StrCat(Secs(p.bound_seconds()), " on ", p.bound_host()));
  Field(&out, "load after", Secs(p.load_seconds()));
  if (!p.hosts().empty()) {
    std::vector<std::vector<std::string>> rows = {
        {"HOST", "SETUP", "MOVE", "VERIFY", "SEAL", "TOTAL", "ROUTE"}};
    for (const v1::HostCost& h : p.hosts()) {
      rows.push_back({h.host(), Secs(h.setup_seconds()), Secs(h.move_seconds()),
                      Secs(h.verify_seconds()), Secs(h.seal_seconds()), Secs(h.total_seconds()),
                      h.route()});
    }
    absl::StrAppend(&out, "\n", RenderTable(rows));
  }
  return out;
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 10) return absl::StrFormat("%.1fs", seconds);
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

namespace {

// "50.0%  1.00 GiB / 2.00 GiB  100 MiB/s  10s left", fields known so far.
// `padded`: a fixed-width percentage, so a redrawn bar does not jump.
std::string ProgressFigures(const ProgressSample& s, absl::string_view sep, bool padded) {
  std::vector<std::string> parts;
  if (s.bytes_total > 0) {
    const double pct = 100.0 * s.bytes_done / s.bytes_total;
    parts.push_back(padded ? absl::StrFormat("%5.1f%%", pct) : absl::StrFormat("%.1f%%", pct));
    parts.push_back(absl::StrCat(FormatBytes(s.bytes_done), " / ", FormatBytes(s.bytes_total)));
  }
  if (s.rate_bytes_per_s >= 0) {
    parts.push_back(absl::StrCat(FormatBytes(static_cast<int64_t>(s.rate_bytes_per_s)), "/s"));
    if (s.rate_bytes_per_s > 0 && s.bytes_total > 0 && s.bytes_done < s.bytes_total) {
      parts.push_back(absl::StrCat(
          FormatSeconds((s.bytes_total - s.bytes_done) / s.rate_bytes_per_s), " left"));
    }
  }
  parts.push_back(absl::StrCat(FormatSeconds(s.elapsed_s), " elapsed"));
  return absl::StrJoin(parts, sep);
}

}  // namespace

std::string FormatProgressBar(const ProgressSample& s, int bar_width) {
  bar_width = std::max(1, bar_width);
  const double frac = s.bytes_total > 0
                          ? std::clamp(static_cast<double>(s.bytes_done) / s.bytes_total, 0.0, 1.0)
                          : (s.state == v1::OPERATION_STATE_COMMITTED ? 1.0 : 0.0);
  const int filled = static_cast<int>(frac * bar_width);
  return absl::StrCat(rpc::EnumShortName(s.state), " [", std::string(filled, '#'),
                      std::string(bar_width - filled, '-'), "] ", ProgressFigures(s, "  ", true));
}

std::string FormatProgressLine(const std::string& operation_id, const ProgressSample& s) {
  return absl::StrCat("operation ", operation_id, ": ", rpc::EnumShortName(s.state), " ",
                      ProgressFigures(s, ", ", false));
}

}  // namespace reshard::cli
