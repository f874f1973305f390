// How reshardctl's server commands print coordinator replies: tables for
// people, proto JSON (original field names, one document) for scripts, and
// the progress of a running operation. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "reshard/v1/coordinator.pb.h"

namespace reshard::cli {

/// `message` as proto JSON: original field names, every field printed,
/// indented, ending in a newline.
[[nodiscard]] absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

/// "tp 2, pp 2, dp 4 (16 ranks) on node-0, node-1 x 8".
std::string FormatLayout(const v1::Layout& layout);

/// "3.2s ago", "in 1.5s", "-" for 0.
std::string FormatRelativeTime(int64_t unix_ms, int64_t now_unix_ms);

/// One row per job: ID, NAME, TENANT, STATE, GEN, TP, PP, DP, RANKS, SIZE, OPERATION.
std::string FormatJobsTable(const v1::ListJobsResponse& jobs);

/// A job's fields, one per line, lost hosts and placement included.
std::string FormatJob(const v1::Job& job, int64_t now_unix_ms);

/// One row per host: HOST, STATE, ADDRESS, DEVICES, TRANSPORTS, HEARTBEAT, LEASE.
std::string FormatHostsTable(const v1::ListHostsResponse& hosts, int64_t now_unix_ms);

/// One row per audit entry: TIME (UTC), IDENTITY, ROLE, TENANT, METHOD, JOB,
/// OPERATION, TARGET, CODE, MESSAGE (cut to 80 characters).
std::string FormatAuditTable(const v1::ListAuditResponse& audit);

/// An operation's fields, one per line; a stop-free one's also when it was
/// prepared (prepare seconds), cut over (by which checkpoint) and its pause.
std::string FormatOperation(const v1::Operation& op, int64_t now_unix_ms);

/// PlanStats: totals, then traffic per host.
std::string FormatPlanStats(const v1::PlanStats& stats);

/// The cost model's prediction (docs/scheduler.md): the total, the critical
/// host and link, the plan's own bound, then each host's phases.
std::string FormatCostPrediction(const v1::CostPrediction& p);
/// `hosts notice`: a row per job (its operation, predicted seconds and
/// target), then why each job not moved was not.
std::string FormatHostNotice(const v1::NoticeHostResponse& notice);

/// A snapshot of a running operation for the progress display.
struct ProgressSample {
  v1::OperationState state = v1::OPERATION_STATE_UNSPECIFIED;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  double rate_bytes_per_s = -1;  // < 0: not known yet
  double elapsed_s = 0;
};

/// "1m05s", "42s", "0.4s".
std::string FormatSeconds(double seconds);

/// One line for a terminal: state, bar of `bar_width` cells, percent,
/// bytes done / total, rate and time left, e.g.
/// "TRANSFERRING [#####-----]  50.0%  1.00 GiB / 2.00 GiB  100 MiB/s  10s left".
std::string FormatProgressBar(const ProgressSample& s, int bar_width);

/// The same as a log line for a non-terminal, prefixed "operation ID: ".
std::string FormatProgressLine(const std::string& operation_id, const ProgressSample& s);

}  // namespace reshard::cli
