#include "tests/coordinator/store/store_fixture.h"

#include <chrono>
#include <pqxx/pqxx>

#include "common/log.h"
#include "planner/planner.h"
#include "services/coordinator/store/migrator.h"

namespace reshard::coordinator::store_test {

const std::string& MigratedTemplate() {
  static const std::string* const name = [] {
    absl::StatusOr<std::string> dsn = testing::CreateFreshDatabase("migrated_template");
    RESHARD_CHECK(dsn.ok()) << dsn.status();
    const absl::Status migrated = Migrate(*dsn);
    RESHARD_CHECK(migrated.ok()) << migrated;
    return new std::string(DatabaseOf(*dsn));
  }();
  return *name;
}

std::string DatabaseOf(const std::string& dsn) {
  const std::string marker = "dbname=";
  const size_t at = dsn.find(marker) + marker.size();
  return dsn.substr(at, dsn.find(' ', at) - at);
}

std::string FreshMigratedDatabase() {
  absl::StatusOr<std::string> dsn = testing::CreateFreshDatabase(
      ::testing::UnitTest::GetInstance()->current_test_info()->name(), MigratedTemplate());
  RESHARD_CHECK(dsn.ok()) << dsn.status();
  return *dsn;
}

void PgStoreTest::SetUp() {
  dsn_ = FreshMigratedDatabase();
  PgStoreOptions options;
  options.dsn = dsn_;
  options.pool_size = 4;
  options.observer = [this](const std::string& statement, double) {
    std::lock_guard<std::mutex> l(observed_mu_);
    observed_.push_back(statement);
  };
  absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = *store;
}

std::shared_ptr<PgStore> ConnectPgStore(const std::string& dsn, int pool_size) {
  PgStoreOptions options;
  options.dsn = dsn;
  options.pool_size = pool_size;
  absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
  RESHARD_CHECK(store.ok()) << store.status();
  return *store;
}

std::shared_ptr<PgStore> PgStoreTest::Connect(int pool_size) {
  return ConnectPgStore(dsn_, pool_size);
}

int64_t CountRowsIn(const std::string& dsn, const std::string& sql_with_job_param,
                    const std::string& job_id) {
  pqxx::connection conn(dsn);
  pqxx::nontransaction n(conn);
  return n.exec_params1(sql_with_job_param, job_id)[0].as<int64_t>();
}

int64_t PgStoreTest::CountRows(const std::string& sql_with_job_param, const std::string& job_id) {
  return CountRowsIn(dsn_, sql_with_job_param, job_id);
}

void StoreContractTest::SetUp() {
  if (!IsPostgres()) {
    MemoryStoreOptions options;
    options.now_unix_ms = [this] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count() +
             memory_clock_offset_ms_.load();
    };
    store_ = std::make_shared<MemoryStore>(std::move(options));
    return;
  }
  dsn_ = FreshMigratedDatabase();
  store_ = Connect();
  ASSERT_NE(store_, nullptr);
}

StorePtr StoreContractTest::Connect(int pool_size) {
  if (!IsPostgres()) return store_;
  return ConnectPgStore(dsn_, pool_size);
}

int64_t StoreContractTest::CountRows(const std::string& sql_with_job_param,
                                     const std::string& job_id) {
  RESHARD_CHECK(IsPostgres()) << "CountRows reads PostgreSQL";
  return CountRowsIn(dsn_, sql_with_job_param, job_id);
}

std::string StoreParamName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

std::vector<std::string> PgStoreTest::Observed() {
  std::lock_guard<std::mutex> l(observed_mu_);
  return observed_;
}

Idempotency Key(const std::string& key, const std::string& method, const std::string& hash) {
  Idempotency idem;
  idem.key = key;
  idem.method = method;
  idem.request_hash = hash;
  return idem;
}

NewOperation Resize(const std::string& op_id, const std::string& job_id, int64_t expected,
                    const v1::Layout& target, const Idempotency& idem) {
  NewOperation op;
  op.operation_id = op_id;
  op.job_id = job_id;
  op.kind = v1::OPERATION_KIND_RESIZE;
  op.expected_generation = expected;
  op.target_layout = target;
  op.idempotency = idem;
  return op;
}

v1::TransferPlan PlanFor(const v1::JobSpec& spec, const v1::Layout& target) {
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(spec.ptc(), spec.layout(), target, {});
  RESHARD_CHECK(plan.ok()) << plan.status();
  return planner::ToProto(*plan, spec.layout(), target);
}

HostProgress Progress(const std::string& host, v1::HostTaskState state, int64_t done,
                      int64_t total) {
  HostProgress p;
  p.host_id = host;
  p.state = state;
  p.bytes_done = done;
  p.bytes_total = total;
  return p;
}

}  // namespace reshard::coordinator::store_test
