#include "services/coordinator/logic/deadlines.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "planner/layout.h"
#include "services/coordinator/logic/cost_estimates.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/redundancy.h"

namespace reshard::coordinator {
namespace {

std::string Seconds(double s) { return absl::StrFormat("%.1f s", s); }

int64_t EndOf(int64_t now_ms, const v1::CostPrediction& p) {
  return now_ms + static_cast<int64_t>(std::ceil(p.seconds() * 1000.0));
}

// What the prediction says, in a clause: "predicted 12.3 s (critical host
// h1, link h0->h1; the plan's bound 8.0 s on h0)".
std::string PredictionText(const v1::CostPrediction& p) {
  std::string text = absl::StrCat("predicted ", Seconds(p.seconds()));
  std::vector<std::string> parts;
  if (!p.critical_host().empty())
    parts.push_back(absl::StrCat("critical host ", p.critical_host()));
  if (!p.critical_link().empty()) parts.push_back(absl::StrCat("link ", p.critical_link()));
  if (!p.bound_host().empty()) {
    parts.push_back(
        absl::StrCat("the plan's bound ", Seconds(p.bound_seconds()), " on ", p.bound_host()));
  }
  if (!p.calibrated()) parts.push_back("rates not all learned yet");
  if (!parts.empty()) absl::StrAppend(&text, " (", absl::StrJoin(parts, "; "), ")");
  return text;
}

absl::StatusOr<v1::CostPrediction> Predicted(const DeadlineCase& c, const v1::Layout& target,
                                             cost::CostModel& model, Store& store) {
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(
      c.job->ptc(), c.job->layout(), target, PlannerLostSet(c.job->layout(), target, c.lost));
  if (!plan.ok()) return plan.status();
  return PredictPlan(model, store, *plan, c.job->layout(), target);
}

}  // namespace

std::string UnixMsText(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

absl::Status CheckDeadlineField(const v1::Deadline& deadline, int64_t now_ms) {
  if (deadline.unix_ms() == 0) {
    if (deadline.abort_past()) {
      return absl::InvalidArgumentError("deadline.abort_past needs deadline.unix_ms");
    }
    return absl::OkStatus();
  }
  if (deadline.unix_ms() <= now_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline.unix_ms ", deadline.unix_ms(), " (", UnixMsText(deadline.unix_ms()),
                     ") is not in the future: the coordinator's clock reads ", now_ms, " (",
                     UnixMsText(now_ms), ")"));
  }
  return absl::OkStatus();
}

v1::Layout RanksKeptInPlace(const v1::Layout& current, const v1::Layout& target) {
  const std::vector<v1::DeviceSlot> now = planner::ExpandPlacement(current.placement());
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(target.placement());
  const auto key = [](const v1::DeviceSlot& s) { return std::make_pair(s.host(), s.device()); };
  std::map<std::pair<std::string, int>, int> free;  // slot -> its index in `slots`
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) free.emplace(key(slots[i]), i);
  std::vector<int> chosen(slots.size(), -1);
  for (int r = 0; r < static_cast<int>(slots.size()) && r < static_cast<int>(now.size()); ++r) {
    auto it = free.find(key(now[r]));
    if (it == free.end()) continue;
    chosen[r] = it->second;
    free.erase(it);
  }
  std::vector<bool> used(slots.size(), false);
  for (int c : chosen) {
    if (c >= 0) used[c] = true;
  }
  int next = 0;
  for (int& c : chosen) {
    if (c >= 0) continue;
    while (used[next]) ++next;
    c = next;
    used[next] = true;
  }
  bool same = true;
  for (size_t r = 0; r < chosen.size(); ++r) same = same && chosen[r] == static_cast<int>(r);
  if (same) return target;
  v1::Layout out;
  *out.mutable_config() = target.config();
  for (int c : chosen) *out.mutable_placement()->add_ranks() = slots[c];
  return out;
}

absl::Status CheckDeadline(const v1::Deadline& deadline, const DeadlineCase& c,
                           cost::CostModel& model, Store& store, int64_t now_ms,
                           v1::CostPrediction* prediction) {
  absl::StatusOr<v1::CostPrediction> p = Predicted(c, *c.target, model, store);
  if (!p.ok()) return p.status();
  if (prediction != nullptr) *prediction = *p;
  const int64_t end = EndOf(now_ms, *p);
  if (end <= deadline.unix_ms()) return absl::OkStatus();

  std::string alternative;
  const v1::Layout kept = RanksKeptInPlace(c.job->layout(), *c.target);
  if (kept.SerializeAsString() != c.target->SerializeAsString()) {
    absl::StatusOr<v1::CostPrediction> q = Predicted(c, kept, model, store);
    if (q.ok() && q->seconds() < p->seconds()) {
      alternative = absl::StrCat(
          "; the same devices with each rank kept where its bytes are (", LayoutText(kept),
          ") are ", PredictionText(*q),
          EndOf(now_ms, *q) <= deadline.unix_ms() ? " and meet the deadline" : " and miss it too");
    }
  }
  if (alternative.empty()) {
    alternative = absl::StrCat(
        "; no faster placement of this target is known; the earliest "
        "deadline it meets is unix_ms ",
        end, " (", UnixMsText(end), ")");
  }
  if (c.could_be_stop_free) {
    absl::StrAppend(&alternative,
                    "; with stop_free the job keeps training through the move and pauses only "
                    "for the cut-over");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job \"", c.job->id(), "\": the move to ", LayoutText(*c.target), " is ", PredictionText(*p),
      ", ending at ", UnixMsText(end), ", ",
      absl::StrFormat("%.1f", (end - deadline.unix_ms()) / 1000.0), " s past the deadline ",
      UnixMsText(deadline.unix_ms()), alternative, " (PreviewPlan gives the same prediction)"));
}

int64_t EtaUnixMs(const v1::Operation& op, int64_t now_ms) {
  if (!IsActiveState(op.state()) || op.planned_unix_ms() <= 0) return 0;
  if (op.bytes_done() > 0 && op.bytes_total() > op.bytes_done() && now_ms > op.planned_unix_ms()) {
    const double rate = static_cast<double>(op.bytes_done()) / (now_ms - op.planned_unix_ms());
    return now_ms + static_cast<int64_t>((op.bytes_total() - op.bytes_done()) / rate);
  }
  const int64_t predicted = op.has_prediction() ? EndOf(op.planned_unix_ms(), op.prediction()) : 0;
  return std::max(predicted, now_ms);
}

std::optional<std::string> DeadlineAbort(const v1::Operation& op, int64_t now_ms) {
  const v1::Deadline& d = op.deadline();
  if (d.unix_ms() <= 0 || !d.abort_past() || now_ms <= d.unix_ms()) return std::nullopt;
  if (!IsActiveState(op.state())) return std::nullopt;
  if (op.stop_free() && op.agents_prepared_unix_ms() > 0) return std::nullopt;  // met
  std::string text = absl::StrCat("deadline ", UnixMsText(d.unix_ms()), " passed (abort_past) in ",
                                  op.phase().empty() ? "its phase" : op.phase());
  if (op.has_prediction() && op.planned_unix_ms() > 0) {
    absl::StrAppend(&text, ": ", PredictionText(op.prediction()), ", running ",
                    Seconds((now_ms - op.planned_unix_ms()) / 1000.0));
  }
  if (op.bytes_total() > 0) {
    absl::StrAppend(&text, ", ", op.bytes_done(), " of ", op.bytes_total(), " bytes moved");
  }
  return text;
}

}  // namespace reshard::coordinator
