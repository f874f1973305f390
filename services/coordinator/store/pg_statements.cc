#include "services/coordinator/store/pg_statements.h"

#include "services/coordinator/store/pg_audit_statements.h"
#include "services/coordinator/store/pg_dataset_statements.h"
#include "services/coordinator/store/pg_heartbeat_statements.h"
#include "services/coordinator/store/pg_meeting_statements.h"
#include "services/coordinator/store/pg_prepare_statements.h"
#include "services/coordinator/store/pg_ptc_statements.h"
#include "services/coordinator/store/pg_rank_failures.h"
#include "services/coordinator/store/pg_stop_free_statements.h"

namespace reshard::coordinator::pg {

const std::vector<Statement>& AllStatements() {
  static const std::vector<Statement>* const kAll = new std::vector<Statement>{
      kSelectJob,
      kListJobs,
      kJobVersions,
      kOperationVersions,
      kInsertJob,
      kLockJob,
      kJobExists,
      kDeleteJob,
      kSetJobState,
      kSetJobPolicy,
      kClearJobPolicy,
      kSetPolicyStatus,
      kJobsWithPolicy,
      kSettleJobState,
      kCountJobsByState,
      kSelectJobLayers,
      kInsertPtcTensors,
      kInsertPtcBlobs,
      kSelectPtcTensors,
      kSelectPtcBlobs,
      kInsertPtcBuckets,
      kSelectPtcBuckets,
      kSetPtcBlobsRegenerable,
      kSelectRegenerableBlobs,
      kInsertGeneration,
      kInsertGenerationRanks,
      kMaxGeneration,
      kDiscardPendingGeneration,
      kRetireCurrentGeneration,
      kPromotePendingGeneration,
      kAdvanceJob,
      kBumpLayoutEpoch,
      kStoreRankChecksums,
      kSelectRankChecksums,
      kGenerationsToRelease,
      kGenerationsToDiscard,
      kSelectIdempotencyKey,
      kClaimIdempotencyKey,
      kSelectOperation,
      kSelectOperationWithPlan,
      kListOperationsForJob,
      kListActiveOperations,
      kActiveOperationOfJob,
      kInsertOperation,
      kLockOperation,
      kOperationState,
      kOperationFacts,
      kTransitionOperation,
      kSetOperationTransferring,
      kFinishCommittedOperation,
      kUpdateOperationBytesDone,
      kOperationsOnHosts,
      kInsertOperationHosts,
      kUpdateHostProgress,
      kSelectHostProgress,
      kAssignedOperations,
      kNotifyTasks,
      kUpsertHost,
      kSetHostLeaves,
      kHeartbeatHost,
      kHostEpochState,
      kListHosts,
      kGetHosts,
      kHostStates,
      kHostRegistrations,
      kSelectHost,
      kExpiredLeases,
      kExpireLeases,
      kJobsOnHosts,
      // Retention
      kPruneRetiredGenerations,
      kPruneDiscardedGenerations,
      kPruneOperations,
      // Liveness (issue 9).
      kDeletedJobs,
      kJobsLostOnHost,
      kClearJobLostHost,
      kClearJobLostHosts,
      kSettleJobLiveness,
      kStaleGenerations,
      // Heartbeats in batches (pg_heartbeat.cc).
      kHeartbeatHosts,
      kHostsEpochState,
      kAssignedOperationsOfHosts,
      kGenerationsToDropOfHosts,
      // Bearer tokens (issue 11).
      kInsertToken,
      kSelectTokenByHash,
      kRevokeToken,
      kListTokens,
      // Cluster secrets (issue 11).
      kInsertClusterSecret,
      kSelectClusterSecret,
      // Audit (issue 11).
      kInsertAudit,
      kListAudit,
      kPruneAudit,
      // Rank failures (issue 20).
      kUpsertRankFailure,
      kSelectRankFailures,
      // Dataset state (issue 12).
      kInsertDatasetState,
      kSelectDatasetState,
      kLockDatasetState,
      kCommitDatasetStep,
      kCarryDatasetState,
      kSetOperationStep,
      kApplyOperationStep,
      kPendingCheckpointOfJob,
      // Stop-free reconfiguration (issue 12).
      kSetOperationStopFree,
      kSetOperationDeadline,
      kLockStopFreeOperation,
      kCutOverOperation,
      kMarkPrepared,
      kKeepReconfiguring,
      // Agents prepare (issue 12).
      kStartPrepare,
      kSetAgentsPrepared,
      kSettlePrepared,
      kPrepareHost,
      kHostTaskState,
      kAddPrecopied,
      kInsertPreparedSources,
      kSelectPreparedSources,
      kHostsNotPrepared,
      kPendingGenerationExists,
      kResetHostsForTransfer,
      kSetPreparedTransferring,
      // A checkpoint and an operation that meet (issue 20).
      kNameStepBoundaryCheckpoint,
      kOperationJob,
      kLockQueuedOperation,
      kReleaseQueuedOperation,
      kStepBoundaryTimedOut,
  };
  return *kAll;
}

}  // namespace reshard::coordinator::pg
