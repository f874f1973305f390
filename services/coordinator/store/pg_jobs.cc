// PgStore: the jobs aggregate (job_store.h): jobs, their PTCs and generations'
// checksums; the change feed's version polls (JobVersions, OperationVersions).
#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_dataset_state.h"
#include "services/coordinator/store/pg_ptc_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/state_memory.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// The PTC as insert_ptc_tensors / insert_ptc_blobs parameters.
struct PtcRows {
  std::string tensor_names, tensor_dtypes, tensor_shapes, tensor_specs;
  std::string blob_names, blob_sizes, blob_scopes;
  std::string bucket_specs;       // empty: the PTC has no bucket groups
  std::string regenerable_blobs;  // empty: no regenerable blob
  int64_t total_bytes = 0;
};

absl::StatusOr<PtcRows> ToPtcRows(const v1::Ptc& ptc) {
  std::vector<std::string> names, shapes, specs;
  std::vector<int64_t> dtypes;
  names.reserve(ptc.tensors_size());
  shapes.reserve(ptc.tensors_size());
  specs.reserve(ptc.tensors_size());
  dtypes.reserve(ptc.tensors_size());
  PtcRows rows;
  absl::StatusOr<int64_t> total_bytes = CheckPtc(ptc);
  if (!total_bytes.ok()) return total_bytes.status();
  rows.total_bytes = *total_bytes;
  for (const v1::TensorSpec& t : ptc.tensors()) {
    names.push_back(t.name());
    dtypes.push_back(t.dtype());
    shapes.push_back(pg::IntArray({t.shape().begin(), t.shape().end()}));
    specs.push_back(pg::Hex(t.partition().SerializeAsString()));
  }
  std::vector<std::string> blob_names;
  std::vector<int64_t> blob_sizes, blob_scopes;
  for (const v1::BlobSpec& b : ptc.blobs()) {
    blob_names.push_back(b.name());
    blob_sizes.push_back(b.size_bytes());
    blob_scopes.push_back(b.scope());
  }
  rows.tensor_names = pg::TextArray(names);
  rows.tensor_dtypes = pg::IntArray(dtypes);
  rows.tensor_shapes = pg::TextArray(shapes);
  rows.tensor_specs = pg::TextArray(specs);
  rows.blob_names = pg::TextArray(blob_names);
  rows.blob_sizes = pg::IntArray(blob_sizes);
  rows.blob_scopes = pg::IntArray(blob_scopes);
  std::vector<int64_t> regenerable;
  for (int i = 0; i < ptc.blobs_size(); ++i) {
    if (ptc.blobs(i).regenerable()) regenerable.push_back(i);
  }
  if (!regenerable.empty()) rows.regenerable_blobs = pg::IntArray(regenerable);
  std::vector<std::string> buckets;
  for (const v1::BucketGroup& g : ptc.buckets()) buckets.push_back(pg::Hex(g.SerializeAsString()));
  if (!buckets.empty()) rows.bucket_specs = pg::TextArray(buckets);
  return rows;
}

// An idempotent retry's answer: the first call's job, which its audit row
// names.
absl::StatusOr<v1::Job> ReplayedJob(pg::PgTx& tx, const std::string& job_id) {
  pg::WriteAudit(tx, job_id, "");
  return pg::ReadJob(tx, job_id);
}

}  // namespace

absl::StatusOr<v1::Job> PgStore::CreateJob(const std::string& job_id, const v1::JobSpec& spec,
                                           const Idempotency& idem,
                                           const v1::DatasetState* dataset_state) {
  if (absl::Status s = CheckNewJob(job_id, spec, idem); !s.ok()) return s;
  // Everything that does not need the database is prepared before the
  // transaction, so that it stays short.
  absl::StatusOr<PtcRows> ptc = ToPtcRows(spec.ptc());
  if (!ptc.ok()) return ptc.status();
  absl::StatusOr<pg::GenerationRows> generation = pg::ToGenerationRows(spec.layout(), "layout");
  if (!generation.ok()) return generation.status();
  const std::string layout_bytes = spec.layout().SerializeAsString();

  return pg::TransactFor<v1::Job>(
      *pool_, "CreateJob", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Job> {
        if (!idem.key.empty()) {
          absl::StatusOr<std::optional<std::string>> first = pg::FindIdempotentResource(tx, idem);
          if (!first.ok()) return first.status();
          if (first->has_value()) return ReplayedJob(tx, **first);
        }
        const pqxx::result inserted =
            tx.Exec(pg::kInsertJob, job_id, spec.tenant(), spec.name(), spec.ptc().num_layers(),
                    spec.ptc().tensors_size(), ptc->total_bytes,
                    static_cast<int>(StoredStateMemory(spec.state_memory())));
        if (inserted.empty()) {
          // (tenant, name) is taken. If it was taken by a concurrent call with
          // the same key, that call's job is the answer.
          if (!idem.key.empty()) {
            absl::StatusOr<std::optional<std::string>> first = pg::FindIdempotentResource(tx, idem);
            if (!first.ok()) return first.status();
            if (first->has_value()) return ReplayedJob(tx, **first);
          }
          return absl::AlreadyExistsError(absl::StrCat("job \"", spec.name(), "\" of tenant \"",
                                                       spec.tenant(), "\" already exists"));
        }
        tx.Exec(pg::kInsertPtcTensors, job_id, ptc->tensor_names, ptc->tensor_dtypes,
                ptc->tensor_shapes, ptc->tensor_specs);
        if (spec.ptc().blobs_size() > 0) {
          tx.Exec(pg::kInsertPtcBlobs, job_id, ptc->blob_names, ptc->blob_sizes, ptc->blob_scopes);
        }
        if (!ptc->regenerable_blobs.empty()) {
          tx.Exec(pg::kSetPtcBlobsRegenerable, job_id, ptc->regenerable_blobs);
        }
        if (!ptc->bucket_specs.empty()) tx.Exec(pg::kInsertPtcBuckets, job_id, ptc->bucket_specs);
        pg::InsertGeneration(tx, job_id, 1, layout_bytes, *generation, GenerationState::kCurrent,
                             "");
        if (spec.has_policy()) {
          tx.Exec(pg::kSetJobPolicy, job_id, pg::Bytea(spec.policy()));
        }
        if (dataset_state != nullptr) pg::InsertDatasetState(tx, job_id, 1, *dataset_state);
        if (!idem.key.empty()) {
          if (absl::Status s = pg::ClaimIdempotencyKey(tx, idem, job_id, job_id); !s.ok()) return s;
        }
        pg::WriteAudit(tx, job_id, "");
        return pg::ReadJob(tx, job_id);
      });
}

absl::StatusOr<v1::Job> PgStore::GetJob(const std::string& job_id, bool include_ptc) {
  return pg::TransactFor<v1::Job>(*pool_, "GetJob", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Job> {
    absl::StatusOr<v1::Job> job = pg::ReadJob(tx, job_id);
    if (!job.ok() || !include_ptc) return job;
    absl::StatusOr<v1::Ptc> ptc = pg::ReadPtc(tx, job_id);
    if (!ptc.ok()) return ptc.status();
    *job->mutable_ptc() = *std::move(ptc);
    return job;
  });
}

absl::StatusOr<v1::Ptc> PgStore::GetPtc(const std::string& job_id) {
  return pg::TransactFor<v1::Ptc>(*pool_, "GetPtc",
                                  [&](pg::PgTx& tx) { return pg::ReadPtc(tx, job_id); });
}

namespace {

// `id -> version` of the rows `statement` finds among `ids`.
absl::StatusOr<std::map<std::string, int64_t>> Versions(pg::PgPool& pool, const char* call,
                                                        const pg::Statement& statement,
                                                        const std::vector<std::string>& ids) {
  using Versions = std::map<std::string, int64_t>;
  return pg::TransactFor<Versions>(pool, call, [&](pg::PgTx& tx) -> absl::StatusOr<Versions> {
    Versions versions;
    for (const pqxx::row& row : tx.Exec(statement, pg::TextArray(ids))) {
      versions.emplace(row[0].c_str(), row[1].as<int64_t>());
    }
    return versions;
  });
}

}  // namespace

absl::StatusOr<std::map<std::string, int64_t>> PgStore::JobVersions(
    const std::vector<std::string>& job_ids) {
  return Versions(*pool_, "JobVersions", pg::kJobVersions, job_ids);
}

absl::StatusOr<std::map<std::string, int64_t>> PgStore::OperationVersions(
    const std::vector<std::string>& operation_ids) {
  return Versions(*pool_, "OperationVersions", pg::kOperationVersions, operation_ids);
}

absl::StatusOr<JobPage> PgStore::ListJobs(const ListJobsQuery& query) {
  constexpr int kMaxPageSize = 10000;
  const int page_size = query.page_size <= 0
                            ? 100
                            : (query.page_size > kMaxPageSize ? kMaxPageSize : query.page_size);
  return pg::TransactFor<JobPage>(*pool_, "ListJobs", [&](pg::PgTx& tx) -> absl::StatusOr<JobPage> {
    // One row more than the page tells whether another page follows.
    const pqxx::result r = tx.Exec(pg::kListJobs, query.tenant, static_cast<int>(query.state),
                                   query.after_job_id, page_size + 1);
    JobPage page;
    for (const pqxx::row& row : r) {
      if (static_cast<int>(page.jobs.size()) == page_size) {
        page.next_after_job_id = page.jobs.back().id();
        break;
      }
      absl::StatusOr<v1::Job> job = pg::JobFromRow(row);
      if (!job.ok()) return job.status();
      page.jobs.push_back(*std::move(job));
    }
    return page;
  });
}

absl::Status PgStore::DeleteJob(const std::string& job_id, const Idempotency& idem) {
  if (absl::Status s = pg::CheckText("idempotency key", idem.key); !s.ok()) return s;
  return pool_->Transact("DeleteJob", [&](pg::PgTx& tx) -> absl::Status {
    // Whether the key names a delete done before (InvalidArgument when it
    // names another request).
    auto done_before = [&]() -> absl::StatusOr<bool> {
      if (idem.key.empty()) return false;
      absl::StatusOr<std::optional<std::string>> first = pg::FindIdempotentResource(tx, idem);
      if (!first.ok()) return first.status();
      return first->has_value();
    };
    // The key first: a retry finds the job gone, and a key used by another
    // request must not delete anything.
    absl::StatusOr<bool> retry = done_before();
    if (!retry.ok() || *retry) return retry.status();
    if (tx.Exec(pg::kLockJob, job_id).empty()) {
      // A concurrent call with the same key may have deleted it just now.
      retry = done_before();
      if (!retry.ok() || *retry) return retry.status();
      return pg::JobNotFound(job_id);
    }
    // While the job exists (the row takes its tenant); a refusal below rolls
    // it back with everything else.
    pg::WriteAudit(tx, job_id, "");
    const pqxx::result active = tx.Exec(pg::kActiveOperationOfJob, job_id);
    if (!active.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job_id, "\" has active operation \"", active[0][0].c_str(), "\" (",
          rpc::EnumShortName(static_cast<v1::OperationState>(active[0][1].as<int>())), ")"));
    }
    tx.Exec(pg::kDeleteJob, job_id);
    // Without a job id: the row must outlive the job it names.
    if (!idem.key.empty()) return pg::ClaimIdempotencyKey(tx, idem, job_id, "");
    return absl::OkStatus();
  });
}

absl::Status PgStore::SetJobState(const std::string& job_id, v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("job \"", job_id, "\": cannot set state JOB_STATE_UNSPECIFIED"));
  }
  return pool_->Transact("SetJobState", [&](pg::PgTx& tx) -> absl::Status {
    if (tx.Exec(pg::kSetJobState, job_id, static_cast<int>(state)).empty()) {
      return pg::JobNotFound(job_id);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::Job> PgStore::SetJobPolicy(const std::string& job_id,
                                              const v1::ElasticPolicy* policy) {
  return pg::TransactFor<v1::Job>(
      *pool_, "SetJobPolicy", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Job> {
        const pqxx::result r = policy != nullptr
                                   ? tx.Exec(pg::kSetJobPolicy, job_id, pg::Bytea(*policy))
                                   : tx.Exec(pg::kClearJobPolicy, job_id);
        if (r.empty()) return pg::JobNotFound(job_id);
        pg::WriteAudit(tx, job_id, "");
        return pg::ReadJob(tx, job_id);
      });
}

absl::Status PgStore::SetPolicyStatus(const std::string& job_id, const std::string& status) {
  return pool_->Transact("SetPolicyStatus", [&](pg::PgTx& tx) -> absl::Status {
    if (tx.Exec(pg::kSetPolicyStatus, job_id, status).empty()) return pg::JobNotFound(job_id);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> PgStore::JobsWithPolicy() {
  using Ids = std::vector<std::string>;
  return pg::TransactFor<Ids>(*pool_, "JobsWithPolicy", [&](pg::PgTx& tx) -> absl::StatusOr<Ids> {
    Ids ids;
    for (const pqxx::row& row : tx.Exec(pg::kJobsWithPolicy)) ids.push_back(row[0].c_str());
    return ids;
  });
}

absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>> PgStore::CountJobsByState() {
  using Counts = std::vector<std::pair<v1::JobState, int64_t>>;
  return pg::TransactFor<Counts>(*pool_, "CountJobsByState", [&](pg::PgTx& tx) {
    Counts counts;
    for (const pqxx::row& row : tx.Exec(pg::kCountJobsByState)) {
      counts.emplace_back(static_cast<v1::JobState>(row[0].as<int>()), row[1].as<int64_t>());
    }
    return absl::StatusOr<Counts>(std::move(counts));
  });
}

absl::StatusOr<std::vector<v1::ShardChecksum>> PgStore::GetGenerationChecksums(
    const std::string& job_id, int64_t generation) {
  using Sums = std::vector<v1::ShardChecksum>;
  return pg::TransactFor<Sums>(
      *pool_, "GetGenerationChecksums", [&](pg::PgTx& tx) -> absl::StatusOr<Sums> {
        Sums sums;
        for (const pqxx::row& row : tx.Exec(pg::kSelectRankChecksums, job_id, generation)) {
          const pqxx::binarystring packed(row[1]);
          if (absl::Status s = pg::UnpackChecksums(packed.str(), row[0].as<int>(), &sums);
              !s.ok()) {
            return s;
          }
        }
        return sums;
      });
}

}  // namespace reshard::coordinator
