// The coordinator's use of its cost model (cost/model.h; docs/scheduler.md,
// "The cost of an operation"): the prediction of a plan with the hosts'
// registration probes from the store, what a host's DONE report teaches, and
// what an operation's end teaches. The one place the APIs and the driver
// reach the model through. Thread-safe as the model and the store are.
#pragma once

#include "cost/model.h"
#include "planner/planner.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// The prediction of moving `plan` from `from` to `to`, with the hosts'
/// registration probes (which the model keeps: NoteProbe). A store that
/// cannot list the hosts leaves every host at the defaults.
v1::CostPrediction PredictPlan(cost::CostModel& model, Store& store, const planner::Plan& plan,
                               const v1::Layout& from, const v1::Layout& to);

/// A host's DONE report of `op`'s transfer: its timings, with the host's
/// bytes from the operation's prediction, teach the model (a checkpoint, a
/// stop-free operation's phases and an operation planned without a
/// prediction teach nothing: their tasks move other bytes than predicted).
void LearnFromDone(cost::CostModel& model, CoordinatorMetrics* metrics, const v1::Operation& op,
                   const v1::ReportProgressRequest& done);

/// `ended`, as read after its end: a commit teaches the overhead and is
/// checked against its prediction (metrics); any other end is forgotten.
void LearnFromEnd(cost::CostModel& model, CoordinatorMetrics* metrics, const v1::Operation& ended);

}  // namespace reshard::coordinator
