// The parallelization advisor: for a model, a global batch and the devices
// offered, the Pareto set of (predicted step time, peak memory per device)
// over tp, pp, dp, micro-batch and activation recomputation, each with the
// cost of reaching it from the job's current layout as the planner computes
// it. Pure: no I/O, no clock, no threads. Thread-safe (no shared state).
// Model, assumptions and validation: docs/advisor.md.
#pragma once

#include "absl/status/statusor.h"
#include "advisor/estimate.h"
#include "advisor/types.h"

namespace reshard::advisor {

/// InvalidArgument, naming the field and value, when the request is
/// malformed (no hosts, hidden not divisible by heads, batch <= 0, ...).
/// An offer on which nothing fits gives an empty Pareto set, not an error.
[[nodiscard]] absl::StatusOr<Advice> Advise(const AdviceRequest& request);

/// The layout Advise() gives `c` on `cluster`: Megatron rank order (tp
/// fastest, then dp, then pp); ranks fill the hosts of `current` first (in
/// its placement order), then the other offered hosts in offer order, using
/// on each host a multiple of tp devices; `current`'s HSDP dp_shard is kept
/// when it divides the candidate's dp (KeptDpShard). InvalidArgument if they
/// do not fit.
[[nodiscard]] absl::StatusOr<v1::Layout> PlaceLayout(const ParallelChoice& c,
                                                     const ClusterOffer& cluster,
                                                     const v1::Layout* current);

/// The Pareto point that completes the most steps in the next
/// `horizon_seconds`, counting the reconfiguration time first:
/// argmax (horizon - reconfig.transfer_seconds) / time.total. Points whose
/// move was not priced (reconfig.computed false while `priced` is true) are
/// skipped; with `priced` false every move counts as free (no current job).
/// -1 when no point finishes a step within the horizon.
int BestForHorizon(const Advice& advice, double horizon_seconds, bool priced);

/// The planner's cost of moving `ptc` from `from` to `to` (MakePlan; `lost`:
/// the hosts and ranks of `from` that are gone, none when null); transfer time = busiest host's
/// max(bytes in, bytes out) / `inter_host_bytes_per_s`. computed = false with the planner's message
/// when it cannot plan.
ReconfigCost PriceReconfig(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                           double inter_host_bytes_per_s, const planner::LostSet* lost = nullptr);

/// Bytes of job state (PTC tensors and blobs) on the most loaded rank of a
/// tp x pp x dp layout of `ptc`; shards of uneven splits rounded up. With
/// HSDP (`dp_shard` > 0, dividing dp) dense data-parallel splits run over
/// dp_shard ranks only (docs/partitioning.md, "Data-parallel groups").
double PtcStateBytesPerDevice(const v1::Ptc& ptc, int tp, int pp, int dp, int dp_shard = 0);

/// The HSDP shard size Advise() keeps for a candidate of `dp` ranks: the
/// current layout's dp_shard when it divides dp, else 0 (shard over dp).
int KeptDpShard(const v1::Layout* current, int dp);

}  // namespace reshard::advisor
