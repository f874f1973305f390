// PgStore: construction and the helpers every part of it shares. The Store
// methods live in pg_jobs.cc, pg_operations.cc, pg_transfer.cc, pg_hosts.cc.
#include "services/coordinator/store/pg_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "planner/layout.h"
#include "services/coordinator/store/migrator.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_dataset_state.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/pg_ptc_statements.h"
#include "services/coordinator/store/pg_rank_failures.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store_internal.h"

namespace reshard::coordinator {

absl::StatusOr<std::shared_ptr<PgStore>> PgStore::Connect(const PgStoreOptions& options) {
  if (options.check_schema) {
    if (absl::Status s = CheckSchema(options.dsn); !s.ok()) return s;
  }
  pg::PgPool::Options pool_options;
  pool_options.dsn = options.dsn;
  pool_options.size = options.pool_size;
  pool_options.agent_reserve = options.agent_reserve;
  pool_options.acquire_timeout = std::chrono::milliseconds(options.acquire_timeout_ms);
  pool_options.statement_timeout = std::chrono::milliseconds(options.statement_timeout_ms);
  pool_options.connect_timeout_s = options.connect_timeout_s;
  pool_options.outage_after = std::chrono::milliseconds(options.outage_after_ms);
  pool_options.observer = options.observer;
  pool_options.statements = pg::AllStatements();
  absl::StatusOr<std::unique_ptr<pg::PgPool>> pool = pg::PgPool::Create(std::move(pool_options));
  if (!pool.ok()) return pool.status();
  std::shared_ptr<PgStore> store(new PgStore(*std::move(pool)));
  store->on_tasks_changed_ = options.on_tasks_changed;
  store->notify_tasks_ = options.notify_tasks;
  return store;
}

PgStore::PgStore(std::unique_ptr<pg::PgPool> pool) : pool_(std::move(pool)) {}
PgStore::~PgStore() = default;

void PgStore::NotifyTasks(pg::PgTx& tx, const std::vector<std::string>& host_ids) const {
  if (notify_tasks_ && !host_ids.empty()) tx.Exec(pg::kNotifyTasks, pg::TextArray(host_ids));
}

absl::Status PgStore::TasksChanged(absl::Status committed,
                                   const std::vector<std::string>& host_ids) const {
  if (committed.ok() && on_tasks_changed_ && !host_ids.empty()) on_tasks_changed_(host_ids);
  return committed;
}

StoreHealth PgStore::Health() const { return pool_->Health(); }
absl::Status PgStore::Probe() { return pool_->Probe(); }

std::vector<std::string> PgStore::StatementNames() {
  std::vector<std::string> names;
  for (const pg::Statement& s : pg::AllStatements()) names.emplace_back(s.name);
  names.emplace_back("commit");
  return names;
}

namespace pg {

absl::Status JobNotFound(absl::string_view job_id) {
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

absl::Status OperationNotFound(absl::string_view operation_id) {
  return absl::NotFoundError(absl::StrCat("operation \"", operation_id, "\" not found"));
}

absl::StatusOr<v1::Job> ReadJob(PgTx& tx, const std::string& job_id) {
  const pqxx::result r = tx.Exec(kSelectJob, job_id);
  if (r.empty()) return JobNotFound(job_id);
  absl::StatusOr<v1::Job> job = JobFromRow(r[0]);
  if (!job.ok()) return job;
  std::optional<v1::DatasetState> dataset = ReadDatasetState(tx, job_id, job->generation());
  if (dataset.has_value()) *job->mutable_dataset_state() = *std::move(dataset);
  ReadRankFailures(tx, job_id, job->generation(), &*job);
  return job;
}

absl::StatusOr<v1::Ptc> ReadPtc(PgTx& tx, const std::string& job_id) {
  const pqxx::result layers = tx.Exec(kSelectJobLayers, job_id);
  if (layers.empty()) return JobNotFound(job_id);
  v1::Ptc ptc;
  ptc.set_num_layers(layers[0][0].as<int>());
  const pqxx::result tensors = tx.Exec(kSelectPtcTensors, job_id);
  ptc.mutable_tensors()->Reserve(static_cast<int>(tensors.size()));
  for (const pqxx::row& row : tensors) {
    v1::TensorSpec* t = ptc.add_tensors();
    t->set_name(row[0].c_str());
    t->set_dtype(static_cast<v1::DType>(row[1].as<int>()));
    for (int64_t d : ParseIntArray(row[2])) t->add_shape(d);
    if (absl::Status s = ParseBytea(row[3], absl::StrCat("partition of tensor \"", t->name(), "\""),
                                    t->mutable_partition());
        !s.ok()) {
      return s;
    }
  }
  for (const pqxx::row& row : tx.Exec(kSelectPtcBlobs, job_id)) {
    v1::BlobSpec* b = ptc.add_blobs();
    b->set_name(row[0].c_str());
    b->set_size_bytes(row[1].as<int64_t>());
    b->set_scope(static_cast<v1::BlobScope>(row[2].as<int>()));
  }
  for (const pqxx::row& row : tx.Exec(kSelectRegenerableBlobs, job_id)) {
    const int idx = row[0].as<int>();
    if (idx >= 0 && idx < ptc.blobs_size()) ptc.mutable_blobs(idx)->set_regenerable(true);
  }
  for (const pqxx::row& row : tx.Exec(kSelectPtcBuckets, job_id)) {
    if (absl::Status s = ParseBytea(row[0], "bucket group", ptc.add_buckets()); !s.ok()) return s;
  }
  return ptc;
}

absl::StatusOr<OperationRecord> ReadOperation(PgTx& tx, const std::string& operation_id,
                                              bool include_plan) {
  const pqxx::result r =
      tx.Exec(include_plan ? kSelectOperationWithPlan : kSelectOperation, operation_id);
  if (r.empty()) return OperationNotFound(operation_id);
  OperationRecord record;
  absl::StatusOr<v1::Operation> op = OperationFromRow(r[0], &record.lost_hosts, &record.lost_ranks);
  if (!op.ok()) return op.status();
  record.op = *std::move(op);
  if (include_plan && !r[0][kOperationColumns].is_null()) {
    v1::TransferPlan plan;
    if (absl::Status s =
            ParseBytea(r[0][kOperationColumns],
                       absl::StrCat("plan of operation \"", operation_id, "\""), &plan);
        !s.ok()) {
      return s;
    }
    record.plan = std::move(plan);
  }
  if (include_plan) record.skipped_steps = ParseIntArray(r[0][kOperationColumns + 1]);
  return record;
}

absl::StatusOr<GenerationRows> ToGenerationRows(const v1::Layout& layout, absl::string_view what) {
  GenerationRows rows;
  rows.tp = layout.config().tp();
  rows.pp = layout.config().pp();
  rows.dp = layout.config().dp();
  rows.world = rows.tp * rows.pp * rows.dp * std::max(layout.config().cp(), 1);
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(layout.placement());
  if (rows.world <= 0 || static_cast<int64_t>(slots.size()) != rows.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": placement has ", slots.size(), " ranks but tp x pp x dp x cp is ", rows.tp, " x ",
        rows.pp, " x ", rows.dp, " x ", std::max(layout.config().cp(), 1)));
  }
  std::vector<std::string> hosts;
  std::vector<int64_t> devices;
  hosts.reserve(slots.size());
  devices.reserve(slots.size());
  for (const v1::DeviceSlot& slot : slots) {
    if (absl::Status s = CheckText(absl::StrCat(what, " host"), slot.host()); !s.ok()) return s;
    hosts.push_back(slot.host());
    devices.push_back(slot.device());
  }
  rows.hosts = TextArray(hosts);
  rows.devices = IntArray(devices);
  return rows;
}

void InsertGeneration(PgTx& tx, const std::string& job_id, int64_t generation,
                      const std::string& layout_bytes, const GenerationRows& rows,
                      GenerationState state, const std::string& operation_id) {
  tx.Exec(kInsertGeneration, job_id, generation, Bytea(layout_bytes), rows.tp, rows.pp, rows.dp,
          rows.world, static_cast<int>(state), operation_id);
  tx.Exec(kInsertGenerationRanks, job_id, generation, rows.hosts, rows.devices);
}

}  // namespace pg
}  // namespace reshard::coordinator
