// Reading a coordinator's /metrics the way Prometheus does: an HTTP GET over
// a plain socket, and a small parser for the text exposition format.
// Thread-safe (no shared state).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace reshard::coordinator::testing {

/// GET http://127.0.0.1:<port><path> (HTTP/1.0, so the body ends at EOF).
/// The body; an error for a refused connection or a status other than 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

/// Sum of the samples of metric `name` (exact name, e.g.
/// "reshard_coordinator_rpc_duration_seconds_count") whose labels include
/// every pair in `labels`; nullopt when no sample matches.
std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::map<std::string, std::string>& labels = {});

/// The value of reshard_coordinator_leader scraped from `metrics_port`;
/// nullopt when the scrape fails or the series is missing.
std::optional<double> ScrapeLeader(int metrics_port);

}  // namespace reshard::coordinator::testing
