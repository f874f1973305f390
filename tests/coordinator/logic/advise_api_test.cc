// The Advise RPC's logic and Resize "let the coordinator choose" against a
// real PostgreSQL: the Pareto set over the registered hosts, each move priced
// as PreviewPlan prices it, the best for the horizon, every refusal with its
// code and the field it names, and the resize that moves to the best layout.
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::TwoLayerJob;
using ::testing::ElementsAre;

class AdviseApiTest : public LogicTest {
 protected:
  // TwoLayerJob (tp 2, pp 2, dp 1 on h0, h1 x 2) with four live agents.
  void SetUp() override {
    LogicTest::SetUp();
    RegisterAgents({"h0", "h1", "h2", "h3"});
    job_ = Register(TwoLayerJob("advised"));
  }

  // The model behind TwoLayerPtc: hidden 8 (qkv 8 x 24), vocab 32 (embed).
  v1::AdviseRequest Request(int gpus) const {
    v1::AdviseRequest r;
    r.set_job_id(job_.id());
    r.set_gpus(gpus);
    r.mutable_model()->set_hidden(8);
    r.mutable_model()->set_heads(2);
    r.mutable_model()->set_vocab(32);
    r.mutable_model()->set_seq_length(64);
    r.mutable_model()->set_global_batch(16);
    return r;
  }

  v1::Job job_;
};

TEST_P(AdviseApiTest, ParetoSetOverTheLiveHostsEachMovePricedAsPreviewPlanDoes) {
  absl::StatusOr<v1::AdviseResponse> advice = api_->Advise(Request(8));
  ASSERT_TRUE(advice.ok()) << advice.status();
  // The job's hosts first, then the others; 2 devices each (CPU agents: the
  // job's ranks per host).
  EXPECT_THAT(advice->hosts(), ElementsAre("h0", "h1", "h2", "h3"));
  EXPECT_THAT(advice->host_devices(), ElementsAre(2, 2, 2, 2));
  EXPECT_EQ(advice->gpu_type(), "A100");
  EXPECT_EQ(advice->horizon_s(), 3600);
  ASSERT_GE(advice->candidates_size(), 1);
  EXPECT_GE(advice->feasible(), advice->candidates_size());
  EXPECT_GE(advice->considered(), advice->feasible());

  const std::set<std::string> offered = {"h0", "h1", "h2", "h3"};
  int priced = 0;
  for (int i = 0; i < advice->candidates_size(); ++i) {
    const v1::AdviseCandidate& c = advice->candidates(i);
    SCOPED_TRACE(i);
    // Pareto: faster ones need strictly more memory.
    if (i > 0) {
      EXPECT_GE(c.step_seconds(), advice->candidates(i - 1).step_seconds());
      EXPECT_LT(c.memory_bytes(), advice->candidates(i - 1).memory_bytes());
    }
    EXPECT_EQ(c.tp() * c.pp() * c.dp(), planner::ExpandPlacement(c.layout().placement()).size());
    EXPECT_EQ(c.layout().config().tp(), c.tp());
    EXPECT_LE(c.tp() * c.pp() * c.dp(), 8);
    for (const v1::DeviceSlot& slot : planner::ExpandPlacement(c.layout().placement())) {
      EXPECT_TRUE(offered.count(slot.host())) << slot.host();
    }
    // Priced as the planner prices it: PreviewPlan's cross-host bytes, or
    // PreviewPlan's refusal (e.g. a dp rank the PTC leaves empty).
    v1::PreviewPlanRequest preview;
    preview.set_job_id(job_.id());
    *preview.mutable_target() = c.layout();
    absl::StatusOr<v1::PreviewPlanResponse> plan = api_->PreviewPlan(preview);
    ASSERT_EQ(plan.ok(), c.reconfig_priced()) << plan.status() << " / " << c.reconfig_error();
    if (!plan.ok()) {
      EXPECT_EQ(c.reconfig_error(), plan.status().message());
      EXPECT_EQ(c.steps_in_horizon(), 0);
      continue;
    }
    ++priced;
    EXPECT_EQ(c.cross_host_bytes(), plan->stats().bytes_cross_host());
    EXPECT_DOUBLE_EQ(c.transfer_seconds(), c.busiest_host_bytes() / 160e9);
    EXPECT_DOUBLE_EQ(c.steps_in_horizon(), (3600 - c.transfer_seconds()) / c.step_seconds());
  }
  EXPECT_GE(priced, 1);
  // The best completes the most steps in the hour after its move.
  ASSERT_GE(advice->best(), 0);
  EXPECT_TRUE(advice->candidates(advice->best()).reconfig_priced());
  for (const v1::AdviseCandidate& c : advice->candidates()) {
    EXPECT_LE(c.steps_in_horizon(), advice->candidates(advice->best()).steps_in_horizon());
  }
}

TEST_P(AdviseApiTest, NamedHostsAreOfferedInTheirOrderAndBoundTheLayouts) {
  v1::AdviseRequest r = Request(4);
  r.add_hosts("h3");
  r.add_hosts("h2");
  r.mutable_devices()->set_devices_per_host(4);
  absl::StatusOr<v1::AdviseResponse> advice = api_->Advise(r);
  ASSERT_TRUE(advice.ok()) << advice.status();
  EXPECT_THAT(advice->hosts(), ElementsAre("h3"));  // 4 devices on the first suffice
  EXPECT_THAT(advice->host_devices(), ElementsAre(4));
  for (const v1::AdviseCandidate& c : advice->candidates()) {
    for (const v1::DeviceSlot& slot : planner::ExpandPlacement(c.layout().placement())) {
      EXPECT_EQ(slot.host(), "h3");
    }
  }
}

TEST_P(AdviseApiTest, ASlowNetworkMakesTheBestOneThatMovesLittle) {
  // At 1 kB/s between hosts every cross-host byte costs a millisecond: over
  // a 10 s horizon the best is one whose move is short, not the fastest.
  v1::AdviseRequest r = Request(8);
  r.set_horizon_s(10);
  r.mutable_devices()->set_inter_host_bytes_per_s(1000);
  absl::StatusOr<v1::AdviseResponse> slow = api_->Advise(r);
  ASSERT_TRUE(slow.ok()) << slow.status();
  ASSERT_GE(slow->best(), 0);
  const v1::AdviseCandidate& best = slow->candidates(slow->best());
  EXPECT_LT(best.transfer_seconds(), 10);
  for (const v1::AdviseCandidate& c : slow->candidates()) {
    EXPECT_LE(c.steps_in_horizon(), best.steps_in_horizon());
    if (c.transfer_seconds() >= 10) {
      EXPECT_EQ(c.steps_in_horizon(), 0);
    }
  }
}

TEST_P(AdviseApiTest, BadInputIsInvalidArgumentNamingTheField) {
  struct Case {
    std::function<void(v1::AdviseRequest&)> change;
    absl::StatusCode code;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](v1::AdviseRequest& r) { r.set_job_id(""); }, absl::StatusCode::kInvalidArgument,
       "job_id"},
      {[](v1::AdviseRequest& r) { r.set_job_id("0123456789abcdef0123456789abcdef"); },
       absl::StatusCode::kNotFound, "0123456789abcdef0123456789abcdef"},
      {[](v1::AdviseRequest& r) { r.set_gpus(0); }, absl::StatusCode::kInvalidArgument, "gpus 0"},
      {[](v1::AdviseRequest& r) { r.set_horizon_s(-1); }, absl::StatusCode::kInvalidArgument,
       "horizon_s -1"},
      {[](v1::AdviseRequest& r) { r.mutable_model()->set_heads(0); },
       absl::StatusCode::kInvalidArgument, "model.heads"},
      {[](v1::AdviseRequest& r) { r.mutable_model()->set_global_batch(0); },
       absl::StatusCode::kInvalidArgument, "model.global_batch"},
      {[](v1::AdviseRequest& r) { r.mutable_model()->set_hidden(0); },  // TwoLayerPtc has none
       absl::StatusCode::kInvalidArgument, "model.hidden"},
      {[](v1::AdviseRequest& r) { r.mutable_model()->set_heads(3); },  // 8 % 3
       absl::StatusCode::kInvalidArgument, "model.heads 3"},
      {[](v1::AdviseRequest& r) { r.mutable_devices()->set_gpu_type("X9"); },
       absl::StatusCode::kInvalidArgument, "devices.gpu_type \"X9\""},
      {[](v1::AdviseRequest& r) { r.mutable_devices()->set_peak_flops(-5); },
       absl::StatusCode::kInvalidArgument, "devices.peak_flops -5"},
      {[](v1::AdviseRequest& r) { r.add_hosts("nope"); }, absl::StatusCode::kInvalidArgument,
       "hosts[0] \"nope\": not a registered host"},
      {[](v1::AdviseRequest& r) {
         r.add_hosts("h0");
         r.add_hosts("h0");
       },
       absl::StatusCode::kInvalidArgument, "hosts[1] \"h0\": named twice"},
      // Fewer devices than asked for, and nothing that fits: FailedPrecondition.
      {[](v1::AdviseRequest& r) { r.set_gpus(100); }, absl::StatusCode::kFailedPrecondition,
       "gpus 100: the 4 live hosts offered have 8 devices"},
      {[](v1::AdviseRequest& r) { r.mutable_devices()->set_memory_bytes(1000); },
       absl::StatusCode::kFailedPrecondition, "no layout of at most 8 A100 devices fits"},
  };
  for (const Case& c : cases) {
    v1::AdviseRequest r = Request(8);
    c.change(r);
    EXPECT_THAT(api_->Advise(r).status(), StatusIs(c.code, c.names)) << r.ShortDebugString();
  }
}

TEST_P(AdviseApiTest, AHostWithANoticeIsNotOfferedByDefault) {
  ASSERT_TRUE(store_->SetHostLeaves("h2", clock_.NowUnixMs() + 60000).ok());
  absl::StatusOr<v1::AdviseResponse> advice = api_->Advise(Request(6));
  ASSERT_TRUE(advice.ok()) << advice.status();
  EXPECT_THAT(advice->hosts(), ElementsAre("h0", "h1", "h3"));
}

TEST_P(AdviseApiTest, ALostHostIsNotOfferedAndNamingItIsFailedPrecondition) {
  clock_.Advance(kLeaseMs / 2);
  for (const std::string h : {"h0", "h1", "h2"}) ASSERT_TRUE(Heartbeat(h).ok());
  clock_.Advance(kLeaseMs / 2 + 1);
  Tick();  // h3's lease expired
  absl::StatusOr<v1::AdviseResponse> advice = api_->Advise(Request(6));
  ASSERT_TRUE(advice.ok()) << advice.status();
  EXPECT_THAT(advice->hosts(), ElementsAre("h0", "h1", "h2"));
  EXPECT_THAT(api_->Advise(Request(8)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "3 live hosts offered have 6"));
  v1::AdviseRequest named = Request(2);
  named.add_hosts("h3");
  EXPECT_THAT(api_->Advise(named).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "hosts[0] \"h3\": host is lost"));
}

TEST_P(AdviseApiTest, ResizeWithChooseTargetsTheBestCandidate) {
  absl::StatusOr<v1::AdviseResponse> advice = api_->Advise(Request(8));
  ASSERT_TRUE(advice.ok()) << advice.status();
  ASSERT_GE(advice->best(), 0);

  v1::ResizeRequest resize;
  resize.set_job_id(job_.id());
  resize.set_expected_generation(1);
  *resize.mutable_choose() = Request(8);
  resize.mutable_choose()->clear_job_id();  // may be left empty
  absl::StatusOr<v1::Operation> op = api_->Resize(resize);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_RESIZE);
  EXPECT_TRUE(
      MessageDifferencer::Equals(op->target_layout(), advice->candidates(advice->best()).layout()))
      << op->target_layout().ShortDebugString();

  // The operation runs like any resize and commits the chosen layout.
  Tick();
  for (const std::string& h : Participants(op->id())) CompleteTask(h, op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op->id()).error();
  EXPECT_TRUE(MessageDifferencer::Equals(Job(job_.id()).layout(), op->target_layout()));
}

TEST_P(AdviseApiTest, ResizeWithChooseRefusalsChangeNothing) {
  const DatabaseSnapshot before = Snapshot();
  auto resize = [&](const std::function<void(v1::ResizeRequest&)>& change) {
    v1::ResizeRequest r;
    r.set_job_id(job_.id());
    r.set_expected_generation(1);
    *r.mutable_choose() = Request(8);
    change(r);
    return api_->Resize(r).status();
  };
  EXPECT_THAT(resize([](v1::ResizeRequest& r) { *r.mutable_placement() = v1::Placement(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "placement and config must be unset"));
  EXPECT_THAT(resize([](v1::ResizeRequest& r) { r.mutable_choose()->set_job_id("other"); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "choose.job_id \"other\""));
  EXPECT_THAT(resize([](v1::ResizeRequest& r) { r.mutable_choose()->set_gpus(0); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "gpus 0"));
  // A horizon shorter than any step: nothing to gain from any layout.
  EXPECT_THAT(resize([](v1::ResizeRequest& r) { r.mutable_choose()->set_horizon_s(1e-12); }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "no candidate completes a step within horizon_s"));
  EXPECT_TRUE(Snapshot() == before);
}

RESHARD_LOGIC_ON_BOTH_STORES(AdviseApiTest);

}  // namespace
}  // namespace reshard::coordinator::testing
