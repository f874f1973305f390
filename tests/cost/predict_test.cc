#include "cost/predict.h"

#include <gtest/gtest.h>

#include "tests/support/job_builders.h"

namespace reshard::cost {
namespace {

using test_support::AddTensor;
using test_support::MakeLayout;
using test_support::SetTpSplit;

constexpr int64_t kMiB = 1 << 20;

// One fp32 tensor of 16 MiB, tp 1 on h0 -> tp 2 on h0, h1: new rank 0 (h0)
// copies the first half locally, new rank 1 (h1) receives the second half.
struct Split {
  v1::Ptc ptc;
  v1::Layout from = MakeLayout(1, 1, 1, {"h0"}, 1);
  v1::Layout to = MakeLayout(2, 1, 1, {"h0", "h1"}, 1);
  Split() { SetTpSplit(AddTensor(&ptc, "w", {4096, 1024}), 0); }
  Traffic Traffic_() const {
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(ptc, from, to, {});
    EXPECT_TRUE(plan.ok()) << plan.status();
    return TrafficOf(*plan, from, to);
  }
};

// What a host's finished task of `traffic` teaches: its bytes and timings.
TaskObservation ObservationOf(const Traffic& traffic, const std::string& host,
                              const v1::TaskTimings& timings) {
  const HostBytes& b = traffic.hosts.at(host);
  TaskObservation o;
  o.host = host;
  o.route = "host";
  o.timings = timings;
  o.bytes_in = b.in;
  o.bytes_out = b.out;
  o.bytes_local = b.local;
  o.bytes_new = b.written;
  return o;
}

TEST(PredictTest, TrafficCountsEachHostAndPair) {
  const Traffic t = Split().Traffic_();
  ASSERT_EQ(t.hosts.size(), 2u);
  const HostBytes& h0 = t.hosts.at("h0");
  const HostBytes& h1 = t.hosts.at("h1");
  EXPECT_EQ(h0.out, 8 * kMiB);
  EXPECT_EQ(h0.in, 0);
  EXPECT_EQ(h0.local, 8 * kMiB);
  EXPECT_EQ(h0.written, 8 * kMiB);
  EXPECT_EQ(h1.in, 8 * kMiB);
  EXPECT_EQ(h1.out, 0);
  EXPECT_EQ(h1.local, 0);
  EXPECT_EQ(h1.written, 8 * kMiB);
  ASSERT_EQ(t.pairs.size(), 1u);
  EXPECT_EQ(t.pairs.at({"h0", "h1"}), 8 * kMiB);
}

TEST(PredictTest, EachHostsPhasesAtItsRates) {
  Defaults d;
  d.link_bytes_per_s = 8.0 * kMiB;   // the transfer: 1 s
  d.copy_bytes_per_s = 16.0 * kMiB;  // setup and the local copy: 0.5 s
  d.hash_bytes_per_s = 8.0 * kMiB;   // verify and seal: 1 s each
  d.overhead_seconds = 0.5;
  CostModel model(d);
  const v1::CostPrediction p = Predict(Split().Traffic_(), model, {});
  ASSERT_EQ(p.hosts_size(), 2);
  for (const v1::HostCost& h : p.hosts()) {
    SCOPED_TRACE(h.host());
    EXPECT_DOUBLE_EQ(h.setup_seconds(), 0.5);
    // The transfer starts once both ends set up (0.5 s) and takes 1 s.
    EXPECT_DOUBLE_EQ(h.move_seconds(), 1.0);
    EXPECT_DOUBLE_EQ(h.verify_seconds(), 1.0);
    EXPECT_DOUBLE_EQ(h.seal_seconds(), 1.0);
    EXPECT_DOUBLE_EQ(h.total_seconds(), 3.5);
    EXPECT_EQ(h.route(), "host");
  }
  EXPECT_EQ(p.hosts(0).bytes_out(), 8 * kMiB);
  EXPECT_EQ(p.hosts(1).bytes_in(), 8 * kMiB);
  EXPECT_DOUBLE_EQ(p.overhead_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(p.seconds(), 4.0);
  EXPECT_EQ(p.critical_host(), "h0");
  EXPECT_EQ(p.critical_link(), "h0->h1");
  EXPECT_DOUBLE_EQ(p.bound_seconds(), 1.0);
  EXPECT_EQ(p.bound_host(), "h0");
  EXPECT_DOUBLE_EQ(p.load_seconds(), 0.5);
  EXPECT_FALSE(p.calibrated());
}

TEST(PredictTest, LearnedRatesMakeItCalibratedAndMoveTheCriticalHost) {
  CostModel model;
  const Traffic t = Split().Traffic_();
  // 8 MiB is too little to learn from: observe a task 4x larger of the
  // same shape.
  Traffic big = t;
  for (auto& [host, b] : big.hosts) {
    b.in *= 4;
    b.out *= 4;
    b.local *= 4;
    b.written *= 4;
  }
  v1::TaskTimings h0;
  h0.set_setup_seconds(0.1);
  h0.set_move_seconds(1.0);  // 32 MiB out, 32 MiB local
  h0.set_verify_seconds(0.1);
  h0.set_seal_seconds(0.1);
  h0.set_total_seconds(1.3);
  v1::TaskTimings h1 = h0;
  h1.set_move_seconds(4.0);  // 32 MiB in: a slow receiver
  h1.set_seal_seconds(0.4);  // and a slow sealer
  h1.set_total_seconds(4.6);
  model.ObserveTask(ObservationOf(big, "h0", h0));
  model.ObserveTask(ObservationOf(big, "h1", h1));
  model.ObserveOperation(4.8, h1.total_seconds());  // the longer task
  const v1::CostPrediction p = Predict(t, model, {});
  EXPECT_TRUE(p.calibrated());
  EXPECT_NEAR(p.overhead_seconds(), 0.2, 1e-12);
  EXPECT_EQ(p.critical_host(), "h1");
  EXPECT_EQ(p.bound_host(), "h1");
  // 8 MiB at h1's 8 MiB/s.
  EXPECT_DOUBLE_EQ(p.bound_seconds(), 1.0);
  // h1: setup 0.025 + transfer 1.0 + verify 0.025 + seal 0.1, plus 0.2;
  // h0 sends as long but seals faster.
  EXPECT_NEAR(p.hosts(1).total_seconds(), 1.15, 1e-12);
  EXPECT_NEAR(p.hosts(0).total_seconds(), 1.075, 1e-12);
  EXPECT_NEAR(p.seconds(), 1.35, 1e-12);
}

// Rates fast enough that only the CPU counts, and 0.25 s of CPU per MiB
// the task moves, learned on both hosts.
Defaults Fast() {
  Defaults d;
  d.link_bytes_per_s = d.copy_bytes_per_s = d.hash_bytes_per_s = 1e15;
  d.overhead_seconds = 0;
  return d;
}

void LearnCpu(CostModel* model) {
  for (const std::string host : {"h0", "h1"}) {
    TaskObservation o;
    o.host = host;
    o.bytes_local = 64 * kMiB;
    o.timings.set_move_seconds(1);
    o.timings.set_cpu_seconds(16);
    model->ObserveTask(o);
  }
}

TEST(PredictTest, HostsOfOneMachineShareItsCpus) {
  const Traffic t = Split().Traffic_();
  v1::HostProbe m1;
  m1.set_machine_id("m1");
  m1.set_cpus(1);
  v1::HostProbe m2 = m1;
  m2.set_machine_id("m2");
  // Apart: the transfer takes 0.25 + 0.25 CPU-s per MiB of two machines'
  // CPUs and h0's copy 0.25 of m1's: on m1, 0.5 r <= 1, so both run at
  // 2 MiB/s and their 8 MiB take 4 s.
  CostModel apart(Fast());
  LearnCpu(&apart);
  v1::CostPrediction p = Predict(t, apart, {{"h0", m1}, {"h1", m2}});
  EXPECT_NEAR(p.hosts(0).move_seconds(), 4.0, 1e-6);
  EXPECT_NEAR(p.hosts(1).move_seconds(), 4.0, 1e-6);
  EXPECT_EQ(p.hosts(0).move_bound(), "cpu");
  EXPECT_DOUBLE_EQ(p.hosts(0).cpu_seconds(), 4.0);  // 16 MiB out and local
  EXPECT_DOUBLE_EQ(p.hosts(1).cpu_seconds(), 2.0);
  // Together on one CPU: 0.75 r <= 1, 4/3 MiB/s, 6 s.
  CostModel together(Fast());
  LearnCpu(&together);
  p = Predict(t, together, {{"h0", m1}, {"h1", m1}});
  EXPECT_NEAR(p.hosts(0).move_seconds(), 6.0, 1e-6);
  EXPECT_NEAR(p.hosts(1).move_seconds(), 6.0, 1e-6);
  EXPECT_EQ(p.hosts(1).move_bound(), "cpu");
}

}  // namespace
}  // namespace reshard::cost
