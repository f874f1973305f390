// "This layout by that deadline" (docs/scheduler.md, "Deadlines"): a
// Resize, Migrate or RecoverFromFailure with a deadline is predicted before
// it is created and refused at once when the prediction ends past it, naming
// the fastest alternative known; while it runs it shows an ETA; past its
// deadline the driver aborts it when the request said so. The rules live
// here once; the scheduler API and the driver call them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "cost/model.h"
#include "planner/planner.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// InvalidArgument naming the field when `deadline` is set (unix_ms != 0)
/// but not after `now_ms`, or set to a negative time. Unset: OK.
[[nodiscard]] absl::Status CheckDeadlineField(const v1::Deadline& deadline, int64_t now_ms);

/// What a deadline is judged for.
struct DeadlineCase {
  const v1::Job* job = nullptr;        // with its PTC, at the request's generation
  const v1::Layout* target = nullptr;  // valid for the job (CheckTarget passed)
  planner::LostSet lost;               // hosts and ranks gone, as the driver plans
  /// A Resize or Migrate not asked stop-free: the refusal says what
  /// stop_free would change.
  bool could_be_stop_free = false;
};

/// Whether the operation of `c`, started at `now_ms`, ends by
/// `deadline.unix_ms` by the cost model's prediction (with the hosts'
/// probes from `store`). OK, with `*prediction` set when non-null, when it
/// does. FailedPrecondition otherwise, naming the predicted seconds, the
/// critical host and link, the plan's own bound, how far past the deadline
/// it would end, and the alternative: the same target with ranks kept on
/// their current devices (RanksKeptInPlace) when that differs and is
/// predicted faster (and whether it meets the deadline), and else the
/// earliest deadline the request meets. The planner's error when it cannot
/// plan (the driver would fail the operation the same way).
[[nodiscard]] absl::Status CheckDeadline(const v1::Deadline& deadline, const DeadlineCase& c,
                                         cost::CostModel& model, Store& store, int64_t now_ms,
                                         v1::CostPrediction* prediction = nullptr);

/// `target` with its config and its device slots, each rank placed on the
/// slot `current` gives it when `target` has that slot, the other ranks on
/// the remaining slots in `target`'s order: the placement that leaves the
/// most of each rank's bytes where they are. `target`'s own placement when
/// it already does.
v1::Layout RanksKeptInPlace(const v1::Layout& current, const v1::Layout& target);

/// An active operation's estimated end (coordinator clock), or 0 when
/// there is none yet (not planned): once bytes move, the rate so far over
/// the bytes left; before, planned + predicted (at least `now_ms`).
int64_t EtaUnixMs(const v1::Operation& op, int64_t now_ms);

/// Whether the driver aborts `op` now: its deadline asks for it, has
/// passed, and the operation has not yet reached what the deadline is for
/// (committed; a stop-free one: its agents prepared). The reason to store
/// when it does.
std::optional<std::string> DeadlineAbort(const v1::Operation& op, int64_t now_ms);

/// A time as people and logs read it: "2026-11-30T01:02:03.456Z".
std::string UnixMsText(int64_t unix_ms);

}  // namespace reshard::coordinator
