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

std::string StoreParamName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

std::vector<std::string> PgStoreTest::Observed() {
  std::lock_guard<std::mutex> l(observed_mu_);
  return observed_;
}

v1::Layout Layout(int tp, int pp, int dp, const std::vector<std::string>& hosts, int per_host) {
  v1::Layout l;
  l.mutable_config()->set_tp(tp);
  l.mutable_config()->set_pp(pp);
  l.mutable_config()->set_dp(dp);
  for (const std::string& h : hosts) l.mutable_placement()->add_hosts(h);
  l.mutable_placement()->set_devices_per_host(per_host);
  return l;
}

namespace {

v1::TensorSpec* AddTensor(v1::Ptc* ptc, const std::string& name, std::vector<int64_t> shape,
                          v1::PipelineMode pipeline, int layer) {
  v1::TensorSpec* t = ptc->add_tensors();
  t->set_name(name);
  t->set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) t->add_shape(d);
  t->mutable_partition()->mutable_pipeline()->set_mode(pipeline);
  t->mutable_partition()->mutable_pipeline()->set_layer(layer);
  return t;
}

void TpSplit(v1::TensorSpec* t, int axis) {
  t->mutable_partition()->mutable_tp()->set_mode(v1::TP_SPLIT);
  t->mutable_partition()->mutable_tp()->set_axis(axis);
}

}  // namespace

v1::JobSpec SmallSpec(const std::string& name, const std::string& tenant) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant(tenant);
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(2);
  TpSplit(AddTensor(ptc, "embedding.weight", {64, 16}, v1::PIPELINE_FIRST_STAGE, 0), 0);
  v1::TensorSpec* qkv = AddTensor(ptc, "layers.0.qkv.weight", {48, 16}, v1::PIPELINE_LAYER, 0);
  TpSplit(qkv, 0);
  for (int64_t b : {16, 16, 16}) qkv->mutable_partition()->mutable_tp()->add_blocks(b);
  TpSplit(AddTensor(ptc, "layers.1.fc.weight", {16, 32}, v1::PIPELINE_LAYER, 1), 1);
  AddTensor(ptc, "final_norm.weight", {16}, v1::PIPELINE_LAST_STAGE, 0);
  v1::TensorSpec* opt =
      AddTensor(ptc, "optimizer.exp_avg.layers.1.fc.weight", {16, 32}, v1::PIPELINE_LAYER, 1);
  TpSplit(opt, 1);
  opt->mutable_partition()->mutable_dp()->set_mode(v1::DP_FLAT);
  v1::BlobSpec* step = ptc->add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  v1::BlobSpec* rng = ptc->add_blobs();
  rng->set_name("rng_state");
  rng->set_size_bytes(16);
  rng->set_scope(v1::BLOB_PER_RANK);
  *spec.mutable_layout() = Layout(2, 2, 1, {"h0", "h1"}, 2);
  return spec;
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

v1::Host MakeHost(const std::string& id) {
  v1::Host h;
  h.set_host_id(id);
  h.set_address(id + ".cluster:7100");
  for (int d = 0; d < 2; ++d) {
    v1::Device* dev = h.add_devices();
    dev->set_index(d);
    dev->set_kind("cuda");
    dev->set_name("H100");
    dev->set_memory_bytes(int64_t{80} << 30);
  }
  h.add_transports("ucx");
  h.set_ucx_address(std::string("\x00\x01\xfe\xff", 4));
  h.set_memory_limit_bytes(int64_t{512} << 30);
  return h;
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
