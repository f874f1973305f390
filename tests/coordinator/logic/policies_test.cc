// Elastic policies (docs/scheduler.md, "Elastic policies") through the
// leader's PolicyEngine, SchedulerApi and the driver, on both stores: a host
// lost under a heal policy is recovered with no client call, onto a spare
// or onto the survivors; min_devices out of reach leaves the job DEGRADED
// saying why; free spares grow the job; every action is audited; a
// scheduler's own call supersedes the policy's operation.
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "services/coordinator/logic/advise_api.h"
#include "services/coordinator/logic/policy_engine.h"
#include "services/coordinator/logic/redundancy.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;
using test_support::SlotsOf;
using test_support::TwoLayerJob;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class PolicyTest : public LogicTest {
 protected:
  void SetUp() override {
    LogicTest::SetUp();
    engine_ = std::make_unique<PolicyEngine>(store_, api_.get(), &clock_, PolicyEngine::Options{});
  }

  v1::Job RegisterWith(v1::JobSpec spec, const v1::ElasticPolicy& policy) {
    *spec.mutable_policy() = policy;
    return Register(spec);
  }

  // `lost`'s lease runs out while every host of `alive` heartbeats; the
  // driver marks it LOST and the job DEGRADED.
  void Lose(const std::string& lost, const std::vector<std::string>& alive) {
    clock_.Advance(kLeaseMs / 2);
    for (const std::string& h : alive) ASSERT_TRUE(Heartbeat(h).ok()) << h;
    clock_.Advance(kLeaseMs / 2 + 1);
    for (const std::string& h : alive) ASSERT_TRUE(Heartbeat(h).ok()) << h;
    Tick();
    absl::StatusOr<v1::Host> host = store_->GetHost(lost);
    ASSERT_TRUE(host.ok()) << host.status();
    ASSERT_EQ(host->state(), v1::HOST_STATE_LOST) << lost;
  }

  void Pass() {
    const absl::Status s = engine_->MaybePass(/*force=*/true);
    EXPECT_TRUE(s.ok()) << s;
  }

  // Plans the job's active operation and completes every host's task.
  void RunActive(const std::string& job_id) {
    const std::string op = Job(job_id).active_operation_id();
    ASSERT_FALSE(op.empty());
    Tick();
    for (const std::string& h : Participants(op)) CompleteTask(h, op);
    Tick();
    ASSERT_EQ(Op(op).state(), v1::OPERATION_STATE_COMMITTED) << Op(op).error();
  }

  // The job's audit rows by the policy, oldest first.
  std::vector<AuditRecord> PolicyAudit(const std::string& job_id) {
    AuditQuery q;
    q.job_id = job_id;
    absl::StatusOr<AuditPage> page = store_->ListAudit(q);
    EXPECT_TRUE(page.ok()) << page.status();
    std::vector<AuditRecord> out;
    if (!page.ok()) return out;
    for (auto it = page->records.rbegin(); it != page->records.rend(); ++it) {
      if (it->identity == "policy") out.push_back(*it);
    }
    return out;
  }

  std::unique_ptr<PolicyEngine> engine_;
};

v1::ElasticPolicy Heal(const std::vector<std::string>& spares = {}) {
  v1::ElasticPolicy p;
  p.set_heal(true);
  for (const std::string& s : spares) p.add_spare_hosts(s);
  return p;
}

TEST_P(PolicyTest, AHostLostUnderAHealPolicyIsRecoveredOntoASpareWithNoCall) {
  const v1::Job job = RegisterWith(ReplicatedTwoLayerJob("healed"), Heal({"h5"}));
  RegisterAgents({"h0", "h1", "h5"});
  Pass();  // nothing lost: nothing to do
  EXPECT_EQ(Job(job.id()).active_operation_id(), "");
  Lose("h1", {"h0", "h5"});
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_DEGRADED);

  Pass();
  const v1::Job healing = Job(job.id());
  ASSERT_FALSE(healing.active_operation_id().empty()) << healing.policy_status();
  const v1::Operation op = Op(healing.active_operation_id());
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RECOVER);
  EXPECT_THAT(op.idempotency_key(), StartsWith("policy:heal:" + job.id() + ":1:"));
  EXPECT_EQ(SlotsOf(op.target_layout()), (std::vector<std::string>{"h0:0", "h5:0"}));
  EXPECT_THAT(healing.policy_status(),
              HasSubstr("policy heal: h1 lost; recovering h1 onto spare h5"));
  EXPECT_THAT(healing.policy_status(), HasSubstr(op.id()));
  const std::vector<AuditRecord> audit = PolicyAudit(job.id());
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0].method, "RecoverFromFailure");
  EXPECT_EQ(audit[0].code, "OK");
  EXPECT_THAT(audit[0].message, HasSubstr("policy heal: h1 lost"));

  Pass();  // the operation is active: nothing more
  RunActive(job.id());
  const v1::Job healed = Job(job.id());
  EXPECT_EQ(healed.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(healed.generation(), 2);
  EXPECT_EQ(SlotsOf(healed.layout()), (std::vector<std::string>{"h0:0", "h5:0"}));
  Pass();
  EXPECT_EQ(Job(job.id()).active_operation_id(), "");
  EXPECT_EQ(PolicyAudit(job.id()).size(), 1u);
}

TEST_P(PolicyTest, WithoutASpareTheHealGoesOntoTheSurvivorsOnlyIfThePolicyAcceptsTheLoss) {
  v1::ElasticPolicy policy = Heal();
  const v1::Job job = RegisterWith(ReplicatedTwoLayerJob("shrunk"), policy);
  RegisterAgents({"h0", "h1"});
  Lose("h1", {"h0"});
  Pass();
  // dp 2 -> 1 gives up surviving any one host's loss: refused, said, audited.
  v1::Job waiting = Job(job.id());
  EXPECT_EQ(waiting.active_operation_id(), "");
  EXPECT_THAT(waiting.policy_status(), HasSubstr("refused: "));
  EXPECT_THAT(waiting.policy_status(), HasSubstr("accept_degraded"));
  ASSERT_EQ(PolicyAudit(job.id()).size(), 1u);
  EXPECT_EQ(PolicyAudit(job.id())[0].code, "FAILED_PRECONDITION");
  Pass();  // not asked again for this generation and policy
  EXPECT_EQ(PolicyAudit(job.id()).size(), 1u);

  policy.set_accept_degraded(true);
  v1::SetPolicyRequest set;
  set.set_job_id(job.id());
  *set.mutable_policy() = policy;
  ASSERT_TRUE(api_->SetPolicy(set).ok());
  Pass();
  const v1::Job healing = Job(job.id());
  ASSERT_FALSE(healing.active_operation_id().empty()) << healing.policy_status();
  EXPECT_EQ(SlotsOf(Op(healing.active_operation_id()).target_layout()),
            (std::vector<std::string>{"h0:0"}));
  EXPECT_THAT(healing.policy_status(), HasSubstr("h1 onto the survivors"));
  RunActive(job.id());
  EXPECT_EQ(Job(job.id()).layout().config().dp(), 1);
}

TEST_P(PolicyTest, MinDevicesOutOfReachLeavesTheJobDegradedSayingWhy) {
  v1::ElasticPolicy policy = Heal();
  policy.set_min_devices(2);
  policy.set_accept_degraded(true);
  const v1::Job job = RegisterWith(ReplicatedTwoLayerJob("floor"), policy);
  RegisterAgents({"h0", "h1"});
  Lose("h1", {"h0"});
  Pass();
  const v1::Job waiting = Job(job.id());
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_DEGRADED);
  EXPECT_EQ(waiting.active_operation_id(), "");
  EXPECT_EQ(waiting.policy_status(),
            "waiting: h1 lost; the survivors and free spares hold 1 devices (tp 1 pp 1 dp 1 on "
            "h0:0), below min_devices 2");
  EXPECT_TRUE(PolicyAudit(job.id()).empty());  // nothing was asked
}

TEST_P(PolicyTest, FreeSparesGrowTheJobUpToMaxDevices) {
  v1::ElasticPolicy policy;
  policy.set_grow(true);
  policy.set_grow_at(v1::ElasticPolicy::GROW_NOW);
  policy.set_max_devices(2);
  policy.add_spare_hosts("h2");  // taken by another job: not free
  policy.add_spare_hosts("h1");
  policy.add_spare_hosts("h3");
  v1::JobSpec spec = ReplicatedTwoLayerJob("grows");
  *spec.mutable_layout() = MakeLayout(1, 1, 1, {"h0"}, 1);
  const v1::Job job = RegisterWith(spec, policy);
  v1::JobSpec other = ReplicatedTwoLayerJob("other");
  *other.mutable_layout() = MakeLayout(1, 1, 1, {"h2"}, 1);
  Register(other);
  RegisterAgents({"h0", "h1", "h2", "h3"});

  Pass();
  const v1::Job growing = Job(job.id());
  ASSERT_FALSE(growing.active_operation_id().empty()) << growing.policy_status();
  const v1::Operation op = Op(growing.active_operation_id());
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RESIZE);
  EXPECT_FALSE(op.at_step_boundary());
  EXPECT_EQ(op.target_layout().config().dp(), 2);
  EXPECT_EQ(SlotsOf(op.target_layout()), (std::vector<std::string>{"h0:0", "h1:0"}));
  EXPECT_THAT(growing.policy_status(),
              HasSubstr("policy grow: onto free spare h1; 1 -> 2 devices, dp 1 -> 2"));
  RunActive(job.id());
  Pass();  // at max_devices: nothing more
  EXPECT_EQ(Job(job.id()).active_operation_id(), "");
  EXPECT_EQ(Job(job.id()).layout().config().dp(), 2);
}

// The model behind TwoLayerPtc (hidden 8, vocab 32) as the advisor needs it.
v1::PolicyAdvice Advice() {
  v1::PolicyAdvice a;
  a.mutable_model()->set_hidden(8);
  a.mutable_model()->set_heads(2);
  a.mutable_model()->set_vocab(32);
  a.mutable_model()->set_seq_length(64);
  a.mutable_model()->set_global_batch(16);
  return a;
}

std::set<std::string> HostsIn(const v1::Layout& l) {
  std::set<std::string> hosts;
  for (const std::string& slot : SlotsOf(l)) hosts.insert(slot.substr(0, slot.find(':')));
  return hosts;
}

TEST_P(PolicyTest, AnAdvisedHealRecoversOntoTheAdvisorsBestForTheDevicesAtHand) {
  v1::ElasticPolicy policy = Heal({"h5"});
  *policy.mutable_advise() = Advice();
  const v1::Job job = RegisterWith(ReplicatedTwoLayerJob("advised-heal"), policy);
  RegisterAgents({"h0", "h1", "h5"});
  Lose("h1", {"h0", "h5"});
  Pass();
  const v1::Job healing = Job(job.id());
  ASSERT_FALSE(healing.active_operation_id().empty()) << healing.policy_status();
  const v1::Operation op = Op(healing.active_operation_id());
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RECOVER);
  // h0's slot and the spare's: the advisor's best on those hosts.
  EXPECT_THAT(healing.policy_status(),
              HasSubstr("policy heal: h1 lost; recovering onto the advisor's best layout for 2 "
                        "devices on h0, h5"));
  const std::set<std::string> used = HostsIn(op.target_layout());
  EXPECT_TRUE(used.count("h1") == 0 && !used.empty()) << LayoutText(op.target_layout());
  EXPECT_LE(planner::WorldSize(op.target_layout().config()), 2);
  RunActive(job.id());
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
}

TEST_P(PolicyTest, AnAdvisedGrowTakesTheAdvisorsBestWhenItHasMoreRanks) {
  v1::ElasticPolicy policy;
  policy.set_grow(true);
  policy.set_grow_at(v1::ElasticPolicy::GROW_NOW);
  policy.add_spare_hosts("h2");
  policy.add_spare_hosts("h3");
  *policy.mutable_advise() = Advice();
  const v1::Job job = RegisterWith(TwoLayerJob("advised-grow"), policy);  // 4 ranks on h0, h1
  RegisterAgents({"h0", "h1", "h2", "h3"});
  // What the advisor answers for the job's and the spares' 8 devices.
  absl::StatusOr<v1::AdviseResponse> advice =
      api_->Advise(AdviceRequest(policy.advise(), job.id(), 8, {"h0", "h1", "h2", "h3"}));
  ASSERT_TRUE(advice.ok()) << advice.status();
  ASSERT_GE(advice->best(), 0);
  const v1::Layout best = advice->candidates(advice->best()).layout();
  ASSERT_GT(planner::WorldSize(best.config()), 4) << LayoutText(best);

  Pass();
  const v1::Job growing = Job(job.id());
  ASSERT_FALSE(growing.active_operation_id().empty()) << growing.policy_status();
  const v1::Operation op = Op(growing.active_operation_id());
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RESIZE);
  EXPECT_EQ(SlotsOf(op.target_layout()), SlotsOf(best));
  EXPECT_EQ(op.target_layout().config().tp(), best.config().tp());
  EXPECT_EQ(op.target_layout().config().pp(), best.config().pp());
  EXPECT_EQ(op.target_layout().config().dp(), best.config().dp());
  EXPECT_THAT(growing.policy_status(), HasSubstr("(the advisor's best: "));
  RunActive(job.id());
  // Grown onto every device: the advisor has nothing more to offer.
  Pass();
  EXPECT_EQ(Job(job.id()).active_operation_id(), "");
}

TEST_P(PolicyTest, AllowedLayoutsTakeTheLargestThatFitsTheDevicesAtHand) {
  v1::ElasticPolicy policy;
  policy.set_grow(true);
  policy.set_grow_at(v1::ElasticPolicy::GROW_NOW);
  policy.set_heal(true);
  policy.set_accept_degraded(true);
  policy.add_spare_hosts("h1");
  policy.add_spare_hosts("h2");
  *policy.add_allowed() = test_support::Config(1, 2, 1);  // 2 ranks
  *policy.add_allowed() = test_support::Config(1, 1, 3);  // 3 ranks
  *policy.add_allowed() = test_support::Config(1, 1, 4);  // 4: more than there are
  v1::JobSpec spec = ReplicatedTwoLayerJob("allowed");
  *spec.mutable_layout() = MakeLayout(1, 1, 1, {"h0"}, 1);
  const v1::Job job = RegisterWith(spec, policy);
  RegisterAgents({"h0", "h1", "h2"});

  // Three devices (h0's and one each on the spares): dp 3.
  Pass();
  v1::Job now = Job(job.id());
  ASSERT_FALSE(now.active_operation_id().empty()) << now.policy_status();
  EXPECT_EQ(SlotsOf(Op(now.active_operation_id()).target_layout()),
            (std::vector<std::string>{"h0:0", "h1:0", "h2:0"}));
  EXPECT_THAT(now.policy_status(),
              HasSubstr("policy grow: onto free spares h1, h2; 1 -> 3 devices, dp 1 -> 3"));
  RunActive(job.id());

  // h2 lost: two devices left, and pp 2 is the allowed layout that fits.
  Lose("h2", {"h0", "h1"});
  Pass();
  now = Job(job.id());
  ASSERT_FALSE(now.active_operation_id().empty()) << now.policy_status();
  const v1::Layout healed = Op(now.active_operation_id()).target_layout();
  EXPECT_EQ(healed.config().pp(), 2);
  EXPECT_EQ(SlotsOf(healed), (std::vector<std::string>{"h0:0", "h1:0"}));
  EXPECT_THAT(now.policy_status(),
              HasSubstr("policy heal: h2 lost; recovering onto the survivors as an allowed "
                        "layout"));
  RunActive(job.id());
  EXPECT_EQ(Job(job.id()).layout().config().pp(), 2);
}

TEST_P(PolicyTest, ASchedulersCallSupersedesThePolicysOperation) {
  v1::ElasticPolicy policy;
  policy.set_grow(true);  // at the next step boundary: waits for a checkpoint
  policy.add_spare_hosts("h1");
  v1::JobSpec spec = ReplicatedTwoLayerJob("overruled");
  *spec.mutable_layout() = MakeLayout(1, 1, 1, {"h0"}, 1);
  const v1::Job job = RegisterWith(spec, policy);
  RegisterAgents({"h0", "h1", "h2"});
  Pass();
  const std::string grow = Job(job.id()).active_operation_id();
  ASSERT_FALSE(grow.empty());
  EXPECT_TRUE(Op(grow).at_step_boundary());

  absl::StatusOr<v1::Operation> mine = ResizeTo(job, MakeLayout(1, 1, 1, {"h2"}, 1));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(Op(grow).state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(Op(grow).error(), HasSubstr("superseded by a scheduler's call"));
  EXPECT_EQ(Job(job.id()).active_operation_id(), mine->id());
}

TEST_P(PolicyTest, APolicyIsCheckedStoredAndCleared) {
  v1::ElasticPolicy bad;
  bad.set_min_devices(4);
  bad.set_max_devices(2);
  v1::RegisterJobRequest reg;
  *reg.mutable_spec() = TwoLayerJob("bad");
  *reg.mutable_spec()->mutable_policy() = bad;
  EXPECT_THAT(api_->RegisterJob(reg).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "spec.policy.max_devices 2 is below min_devices 4"));

  const v1::Job job = Register(TwoLayerJob("kept"));
  EXPECT_FALSE(job.has_policy());
  v1::SetPolicyRequest set;
  set.set_job_id(job.id());
  set.mutable_policy()->add_spare_hosts("s");
  set.mutable_policy()->add_spare_hosts("s");
  EXPECT_THAT(api_->SetPolicy(set).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "policy.spare_hosts names \"s\" twice"));
  set.clear_policy();
  set.mutable_policy()->add_allowed()->set_tp(2);
  EXPECT_THAT(api_->SetPolicy(set).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "policy.allowed[0] is tp 2 pp 0 dp 0; each must be >= 1"));
  set.clear_policy();
  *set.mutable_policy()->mutable_advise() = Advice();
  set.mutable_policy()->add_allowed()->set_tp(1);
  set.mutable_policy()->mutable_allowed(0)->set_pp(1);
  set.mutable_policy()->mutable_allowed(0)->set_dp(1);
  EXPECT_THAT(api_->SetPolicy(set).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "policy.allowed and policy.advise exclude one another"));
  set.mutable_policy()->clear_allowed();
  set.mutable_policy()->mutable_advise()->mutable_model()->clear_heads();
  EXPECT_THAT(api_->SetPolicy(set).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "policy.advise.model.heads 0: required (the job's PTC does not say it)"));
  set.mutable_policy()->mutable_advise()->set_horizon_s(-1);
  EXPECT_THAT(api_->SetPolicy(set).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "policy.advise.horizon_s -1"));
  *set.mutable_policy() = Heal({"h9"});
  absl::StatusOr<v1::Job> with = api_->SetPolicy(set);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(with->policy().heal());
  EXPECT_EQ(Job(job.id()).policy().spare_hosts(0), "h9");
  set.clear_policy();
  ASSERT_TRUE(api_->SetPolicy(set).ok());
  EXPECT_FALSE(Job(job.id()).has_policy());
  set.set_job_id("nope");
  EXPECT_THAT(api_->SetPolicy(set).status(), StatusIs(absl::StatusCode::kNotFound, "nope"));
}

RESHARD_LOGIC_ON_BOTH_STORES(PolicyTest);

}  // namespace
}  // namespace reshard::coordinator::testing
