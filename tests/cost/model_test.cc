#include "cost/model.h"

#include <gtest/gtest.h>

namespace reshard::cost {
namespace {

constexpr int64_t kMiB = 1 << 20;

v1::TaskTimings Timings(double setup, double move, double verify, double seal, double cpu = 0) {
  v1::TaskTimings t;
  t.set_setup_seconds(setup);
  t.set_move_seconds(move);
  t.set_verify_seconds(verify);
  t.set_seal_seconds(seal);
  t.set_total_seconds(setup + move + verify + seal);
  t.set_cpu_seconds(cpu);
  return t;
}

TEST(CostModelTest, SeedsComeFromTheProbeAndTheDefaults) {
  Defaults d;
  d.link_bytes_per_s = 100;
  d.copy_bytes_per_s = 200;
  d.hash_bytes_per_s = 300;
  d.overhead_seconds = 0.25;
  CostModel model(d);
  HostRates none = model.RatesOf("h0", nullptr);
  EXPECT_DOUBLE_EQ(none.send.bytes_per_s, 100);
  EXPECT_DOUBLE_EQ(none.receive.bytes_per_s, 100);
  EXPECT_DOUBLE_EQ(none.copy.bytes_per_s, 200);
  EXPECT_DOUBLE_EQ(none.seal.bytes_per_s, 300);
  EXPECT_FALSE(none.send.learned);
  EXPECT_EQ(none.route, "host");
  v1::HostProbe probe;
  probe.set_copy_bytes_per_s(5e9);
  probe.set_hash_bytes_per_s(7e9);
  HostRates probed = model.RatesOf("h0", &probe);
  EXPECT_DOUBLE_EQ(probed.copy.bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(probed.setup.bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(probed.verify.bytes_per_s, 7e9);
  EXPECT_DOUBLE_EQ(probed.seal.bytes_per_s, 7e9);
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.25);
  EXPECT_FALSE(model.OverheadLearned());
}

TEST(CostModelTest, ATaskTeachesEachPhaseItsRateAndTheDominantDirection) {
  CostModel model;
  TaskObservation o;
  o.host = "h1";
  o.bytes_in = 400 * kMiB;
  o.bytes_out = 100 * kMiB;
  o.bytes_local = 50 * kMiB;
  o.bytes_new = 450 * kMiB;
  o.route = "host";
  o.timings = Timings(0.45, 2.0, 0.9, 0.3, 1.1);
  model.ObserveTask(o);
  HostRates r = model.RatesOf("h1", nullptr);
  EXPECT_TRUE(r.receive.learned);
  EXPECT_DOUBLE_EQ(r.receive.bytes_per_s, 200.0 * kMiB);
  // The other direction went at least 100 MiB in 2 s.
  EXPECT_TRUE(r.send.learned);
  EXPECT_DOUBLE_EQ(r.send.bytes_per_s, 50.0 * kMiB);
  EXPECT_DOUBLE_EQ(r.setup.bytes_per_s, 1000.0 * kMiB);
  EXPECT_DOUBLE_EQ(r.verify.bytes_per_s, 500.0 * kMiB);
  EXPECT_DOUBLE_EQ(r.seal.bytes_per_s, 1500.0 * kMiB);
  EXPECT_FALSE(r.copy.learned);  // the network dominated the move
  EXPECT_DOUBLE_EQ(r.cpu_seconds_per_byte, 1.1 / (550.0 * kMiB));
  // Another host is untouched.
  EXPECT_FALSE(model.RatesOf("h0", nullptr).receive.learned);
}

TEST(CostModelTest, RatesAverageInSecondsPerByte) {
  CostModel model;
  TaskObservation o;
  o.host = "h1";
  o.bytes_in = 100 * kMiB;
  o.timings = Timings(0, 1.0, 0, 0);
  model.ObserveTask(o);
  o.timings = Timings(0, 3.0, 0, 0);
  model.ObserveTask(o);
  // 1 s and 3 s per 100 MiB, weighted evenly: 2 s per 100 MiB.
  EXPECT_DOUBLE_EQ(model.RatesOf("h1", nullptr).receive.bytes_per_s, 50.0 * kMiB);
}

TEST(CostModelTest, SmallPhasesTeachNothing) {
  CostModel model;
  TaskObservation o;
  o.host = "h1";
  o.bytes_in = CostModel::kMinBytes - 1;
  o.bytes_new = CostModel::kMinBytes - 1;
  o.timings = Timings(1, 1, 1, 1);
  model.ObserveTask(o);
  HostRates r = model.RatesOf("h1", nullptr);
  EXPECT_FALSE(r.receive.learned);
  EXPECT_FALSE(r.setup.learned);
  EXPECT_FALSE(r.seal.learned);
  EXPECT_FALSE(r.copy.learned);  // no local bytes either
}

TEST(CostModelTest, ALocalMoveTeachesTheCopyRate) {
  CostModel model;
  TaskObservation o;
  o.host = "h1";
  o.bytes_local = 300 * kMiB;
  o.timings = Timings(0, 0.5, 0, 0);
  model.ObserveTask(o);
  HostRates r = model.RatesOf("h1", nullptr);
  EXPECT_TRUE(r.copy.learned);
  EXPECT_DOUBLE_EQ(r.copy.bytes_per_s, 600.0 * kMiB);
}

TEST(CostModelTest, TheOverheadIsWhatTheLongestTaskLeaves) {
  CostModel model;
  model.ObserveOperation(5.0, 4.0);
  EXPECT_TRUE(model.OverheadLearned());
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 1.0);
  model.ObserveOperation(2.5, 2.0);
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.75);
  model.ObserveOperation(1.0, 3.0);  // reports of tasks longer than the operation: 0
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.375);
  model.ObserveOperation(0, 0);  // nothing measured: ignored
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.375);
}

TEST(CostModelTest, ACommitLearnsFromItsLongestTaskOnly) {
  CostModel model;
  TaskObservation a;
  a.host = "h0";
  a.timings = Timings(0, 2.0, 0, 0);
  TaskObservation b = a;
  b.host = "h1";
  b.timings = Timings(0, 3.0, 0, 0);
  model.ObserveTask("op-1", a);
  model.ObserveTask("op-1", b);
  model.ObserveTask("op-2", a);
  model.Forget("op-2");
  model.ObserveCommit("op-2", 10.0);  // forgotten: nothing learned
  EXPECT_FALSE(model.OverheadLearned());
  model.ObserveCommit("op-1", 3.5);
  EXPECT_TRUE(model.OverheadLearned());
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.5);
  model.ObserveCommit("op-1", 9.0);  // once only
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.5);
}

TEST(CostModelTest, ACommitOnACpuBoundMachineTeachesItsNicsOnlyAFloor) {
  // Two hosts of one machine with 2 CPUs: their tasks used 3.2 of its
  // 2 x 2 s, 80 % (CPU-bound); a third host on a machine of its own was not.
  CostModel model;
  v1::HostProbe shared;
  shared.set_machine_id("m1");
  shared.set_cpus(2);
  model.NoteProbe("h0", shared);
  model.NoteProbe("h1", shared);
  v1::HostProbe alone;
  alone.set_machine_id("m2");
  alone.set_cpus(2);
  model.NoteProbe("h2", alone);
  auto task = [](const std::string& host, double move, double cpu) {
    TaskObservation o;
    o.host = host;
    o.bytes_in = 100 * kMiB;
    o.timings = Timings(0, move, 0, 0, cpu);
    return o;
  };
  model.ObserveTask(task("h0", 1.0, 0));  // h0 received at 100 MiB/s before
  ASSERT_DOUBLE_EQ(model.RatesOf("h0", nullptr).receive.bytes_per_s, 100.0 * kMiB);
  model.ObserveTask("op-1", task("h0", 2.0, 1.6));
  model.ObserveTask("op-1", task("h1", 2.0, 1.6));
  model.ObserveTask("op-1", task("h2", 4.0, 0.4));
  // Nothing of the network until the commit.
  EXPECT_FALSE(model.RatesOf("h2", nullptr).receive.learned);
  EXPECT_FALSE(model.RatesOf("h1", nullptr).receive.learned);
  EXPECT_DOUBLE_EQ(model.RatesOf("h1", nullptr).cpu_seconds_per_byte, 1.6 / (100.0 * kMiB));
  model.ObserveCommit("op-1", 4.5);
  // CPU-bound: h0 keeps its faster rate, h1 gets the floor of 50 MiB/s.
  EXPECT_DOUBLE_EQ(model.RatesOf("h0", nullptr).receive.bytes_per_s, 100.0 * kMiB);
  EXPECT_TRUE(model.RatesOf("h1", nullptr).receive.learned);
  EXPECT_DOUBLE_EQ(model.RatesOf("h1", nullptr).receive.bytes_per_s, 50.0 * kMiB);
  // Not CPU-bound: h2 learns its rate, 25 MiB/s.
  EXPECT_TRUE(model.RatesOf("h2", nullptr).receive.learned);
  EXPECT_DOUBLE_EQ(model.RatesOf("h2", nullptr).receive.bytes_per_s, 25.0 * kMiB);
  EXPECT_EQ(model.RatesOf("h0", nullptr).machine, "m1");
  EXPECT_EQ(model.RatesOf("h0", nullptr).cpus, 2);
  EXPECT_DOUBLE_EQ(model.OverheadSeconds(), 0.5);
}

}  // namespace
}  // namespace reshard::cost
