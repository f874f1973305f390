#include "cost/scale_sim.h"

#include <gtest/gtest.h>

#include "cost/topology.h"
#include "tests/support/job_builders.h"

namespace reshard::cost {
namespace {

using test_support::AddTensor;
using test_support::MakeLayout;
using test_support::SetTpSplit;

constexpr double kHalf = 8 << 20;  // bytes: half of the 16 MiB tensor

Topology Parsed(const std::string& text) {
  absl::StatusOr<Topology> t = ParseTopology(text);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Topology{};
}

// One fp32 tensor of 16 MiB (4096 x 1024) on one rank, split tp 2: the new
// rank 0 keeps the first half on the old rank's GPU, the new rank 1 gets
// the second half on `to_slot`.
struct Split {
  v1::Ptc ptc;
  v1::Layout from = MakeLayout(1, 1, 1, {"h0"}, 1);
  v1::Layout to;
  planner::Plan plan;
  Split(const std::string& to_host, int to_device) {
    SetTpSplit(AddTensor(&ptc, "w", {4096, 1024}), 0);
    to.mutable_config()->set_tp(2);
    to.mutable_config()->set_pp(1);
    to.mutable_config()->set_dp(1);
    v1::DeviceSlot* a = to.mutable_placement()->add_ranks();
    a->set_host("h0");
    a->set_device(0);
    v1::DeviceSlot* b = to.mutable_placement()->add_ranks();
    b->set_host(to_host);
    b->set_device(to_device);
    absl::StatusOr<planner::Plan> p = planner::MakePlan(ptc, from, to, {});
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) plan = *std::move(p);
  }
  ScaleResult Run(const Topology& t, DataPlane plane) const {
    absl::StatusOr<ScaleResult> r = SimulateScale(plan, from, to, t, plane);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ScaleResult{};
  }
};

TEST(TopologyTest, ParsesEveryKeyWithItsUnit) {
  const Topology t = Parsed(
      "# a comment line\n"
      "hosts 129\n"
      "gpus_per_host 8   # trailing comment\n"
      "nvlink 450GB/s\n"
      "pcie 50GB/s\n"
      "hbm 1600GB/s\n"
      "nics_per_host 4\n"
      "nic 400Gb/s\n"
      "network fat-tree\n"
      "oversubscription 2.5\n"
      "hosts_per_leaf 16\n"
      "agent_cores 12\n"
      "cpu_per_byte 1.4s/GB\n"
      "cpu_per_local_byte 0.5s/MB\n"
      "host_copy 200Mb/s\n"
      "hash 2GB/s\n"
      "overhead 0.25s\n");
  EXPECT_EQ(t.hosts, 129);
  EXPECT_EQ(t.gpus_per_host, 8);
  EXPECT_DOUBLE_EQ(t.nvlink, 450e9);
  EXPECT_DOUBLE_EQ(t.pcie, 50e9);
  EXPECT_DOUBLE_EQ(t.hbm, 1600e9);
  EXPECT_EQ(t.nics_per_host, 4);
  EXPECT_DOUBLE_EQ(t.nic, 50e9);
  EXPECT_EQ(t.network, Network::kFatTree);
  EXPECT_DOUBLE_EQ(t.oversubscription, 2.5);
  EXPECT_EQ(t.hosts_per_leaf, 16);
  EXPECT_EQ(t.agent_cores, 12);
  EXPECT_DOUBLE_EQ(t.cpu_seconds_per_byte, 1.4e-9);
  EXPECT_DOUBLE_EQ(t.cpu_seconds_per_local_byte, 0.5e-6);
  EXPECT_DOUBLE_EQ(t.host_copy, 25e6);
  EXPECT_DOUBLE_EQ(t.hash, 2e9);
  EXPECT_DOUBLE_EQ(t.overhead_seconds, 0.25);
  EXPECT_EQ(Describe(t),
            "129 hosts x 8 GPUs (NVLink 450 GB/s, PCIe 50 GB/s per GPU each way), 4 x 400 Gb/s "
            "NICs per host, fat-tree network, 16 hosts per leaf, 2.5:1 oversubscribed; agents: 12 "
            "cores, 1.40 CPU-s/GB sent or received, 500.00 CPU-s/GB copied, host copies 0.025 "
            "GB/s, checks 2 GB/s per core, 0.25s overhead");
}

TEST(TopologyTest, NamesTheLineKeyAndValueOfAFault) {
  const auto error = [](const std::string& text) {
    absl::StatusOr<Topology> t = ParseTopology(text);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << text;
    return std::string(t.status().message());
  };
  EXPECT_EQ(error("hosts 2\nnic 400\n"),
            "topology line 2: nic must be a rate such as 400Gb/s, not \"400\"");
  EXPECT_EQ(error("hosts 2\n\nlinks 3\n"), "topology line 3: unknown key \"links\"");
  EXPECT_EQ(error("hosts 2 3\n"),
            "topology line 1: hosts takes one value (a positive integer), got 2");
  EXPECT_EQ(error("hosts 0\n"), "topology line 1: hosts must be a positive integer, not \"0\"");
  EXPECT_EQ(error("hosts 2\nhosts 3\n"), "topology line 2: hosts set again (first on line 1)");
  EXPECT_EQ(error("network torus\nhosts 2\n"),
            "topology line 1: network must be rail or fat-tree, not \"torus\"");
  EXPECT_EQ(error("hosts 2\noversubscription 0.5\n"),
            "topology line 2: oversubscription must be a number >= 1, not \"0.5\"");
  EXPECT_EQ(error("hosts 2\ncpu_per_byte 3GB/s\n"),
            "topology line 2: cpu_per_byte must be CPU-seconds per byte such as 1.4s/GB, not "
            "\"3GB/s\"");
  EXPECT_EQ(error("hosts 2\noverhead 3\n"),
            "topology line 2: overhead must be seconds such as 0.5s, not \"3\"");
  EXPECT_EQ(error("gpus_per_host 8\n"), "topology: hosts is required (the number of hosts)");
  EXPECT_EQ(error("hosts 2\ngpus_per_host 8\nnics_per_host 3\n"),
            "topology: gpus_per_host 8 and nics_per_host 3 must divide one another (each GPU "
            "uses the NIC of its PCIe switch)");
}

// Direct: the half kept on h0's GPU 0 is a copy in its memory (read and
// written: 2 bytes of it per byte), the other half crosses h0's NIC to h1's.
TEST(ScaleSimTest, DirectMovesAcrossTheRailAndWithinAGpu) {
  const Topology t = Parsed("hosts 2\ngpus_per_host 1\nnics_per_host 1\nnic 1MB/s\nhbm 4MB/s\n");
  const ScaleResult r = Split("h1", 0).Run(t, DataPlane::kDirect);
  EXPECT_EQ(r.bytes_cross_host, kHalf);
  EXPECT_EQ(r.bytes_local, kHalf);
  EXPECT_EQ(r.flows, 2);
  EXPECT_DOUBLE_EQ(r.move.seconds, kHalf / 1e6);
  EXPECT_DOUBLE_EQ(r.move.bound_seconds, kHalf / 1e6);
  EXPECT_EQ(r.move.critical, "h0 nic0 out");
  EXPECT_DOUBLE_EQ(r.total_seconds, r.move.seconds);
  EXPECT_EQ(r.publish.seconds, 0);
  EXPECT_EQ(r.load.seconds, 0);
}

// GPU 0 of h0 to GPU 1 of h1 on a rail network: half over NVLink to h0's
// GPU 1 first (PXN), then rail 1; half over rail 0, then NVLink to h1's
// GPU 1. Each half has its own NVLink and rail, so a slow NVLink sets the
// time of half the bytes.
TEST(ScaleSimTest, RailSplitsACrossRailMoveOverBothRails) {
  const Topology t = Parsed(
      "hosts 2\ngpus_per_host 2\nnics_per_host 2\nnic 1MB/s\nnvlink 0.5MB/s\nhbm 1000MB/s\n");
  const ScaleResult r = Split("h1", 1).Run(t, DataPlane::kDirect);
  EXPECT_EQ(r.flows, 3);  // the two halves and the copy kept on h0's GPU 0
  EXPECT_DOUBLE_EQ(r.move.seconds, kHalf / 2 / 0.5e6);
  EXPECT_EQ(r.move.critical, "h0 gpu0 nvlink out");
}

// The same on a fat-tree: h0's NIC 0 to h1's NIC 1 through the leaves'
// uplinks, a quarter of the leaf's one host's two NICs (oversubscribed 4:1).
TEST(ScaleSimTest, FatTreeCrossesTheOversubscribedLeafUplinks) {
  const Topology t = Parsed(
      "hosts 2\ngpus_per_host 2\nnics_per_host 2\nnic 1MB/s\nnvlink 0.5MB/s\nhbm 1000MB/s\n"
      "network fat-tree\nhosts_per_leaf 1\noversubscription 4\n");
  const ScaleResult r = Split("h1", 1).Run(t, DataPlane::kDirect);
  EXPECT_DOUBLE_EQ(r.move.seconds, kHalf / 0.5e6);
  EXPECT_EQ(r.move.critical, "leaf 0 uplink");
  // One leaf for both: NIC-bound.
  const Topology one_leaf = Parsed(
      "hosts 2\ngpus_per_host 2\nnics_per_host 2\nnic 1MB/s\nnvlink 0.5MB/s\nhbm 1000MB/s\n"
      "network fat-tree\nhosts_per_leaf 2\noversubscription 4\n");
  const ScaleResult same = Split("h1", 1).Run(one_leaf, DataPlane::kDirect);
  EXPECT_DOUBLE_EQ(same.move.seconds, kHalf / 1e6);
  EXPECT_EQ(same.move.critical, "h0 nic0 out");
}

// Today's agents: the old rank publishes the 16 MiB it is read over PCIe;
// h0's agent core sends one half and copies the other (each byte 1 CPU-us:
// the core, not the NIC, sets the pace); each new rank loads its half.
TEST(ScaleSimTest, HostStagedPublishesMovesOnTheAgentsCoresAndLoads) {
  const Topology t = Parsed(
      "hosts 2\ngpus_per_host 1\nnics_per_host 1\nnic 1MB/s\npcie 4MB/s\nagent_cores 1\n"
      "cpu_per_byte 1s/MB\ncpu_per_local_byte 1s/MB\nhost_copy 100MB/s\nhash 2MB/s\n"
      "overhead 0.5s\n");
  const ScaleResult r = Split("h1", 0).Run(t, DataPlane::kHostStaged);
  EXPECT_DOUBLE_EQ(r.publish.seconds, 2 * kHalf / 4e6);
  EXPECT_EQ(r.publish.critical, "h0 gpu0 pcie out");
  EXPECT_DOUBLE_EQ(r.move.seconds, 2 * kHalf / 1e6);
  EXPECT_DOUBLE_EQ(r.move.bound_seconds, 2 * kHalf / 1e6);
  EXPECT_EQ(r.move.critical, "h0 agent cores");
  EXPECT_DOUBLE_EQ(r.load.seconds, kHalf / 4e6);
  EXPECT_EQ(r.load.critical, "h0 gpu0 pcie in");
  // Each host hashes the half its new rank gets on its one core.
  EXPECT_DOUBLE_EQ(r.check.seconds, kHalf / 2e6);
  EXPECT_EQ(r.check.critical, "h0 agent cores");
  EXPECT_DOUBLE_EQ(r.overhead_seconds, 0.5);
  EXPECT_DOUBLE_EQ(r.total_seconds,
                   2 * kHalf / 4e6 + 2 * kHalf / 1e6 + kHalf / 2e6 + kHalf / 4e6 + 0.5);
  // A job in host memory: no publish, no load.
  const ScaleResult m = Split("h1", 0).Run(t, DataPlane::kHostMemory);
  EXPECT_EQ(m.publish.seconds, 0);
  EXPECT_EQ(m.load.seconds, 0);
  EXPECT_DOUBLE_EQ(m.total_seconds, 2 * kHalf / 1e6 + kHalf / 2e6 + 0.5);
  // Two cores: the NIC's 1 MB/s is the limit again.
  const Topology two = Parsed(
      "hosts 2\ngpus_per_host 1\nnics_per_host 1\nnic 1MB/s\npcie 4MB/s\nagent_cores 2\n"
      "cpu_per_byte 1s/MB\ncpu_per_local_byte 1s/MB\nhost_copy 100MB/s\n");
  const ScaleResult r2 = Split("h1", 0).Run(two, DataPlane::kHostStaged);
  EXPECT_DOUBLE_EQ(r2.move.seconds, kHalf / 1e6);
  EXPECT_EQ(r2.move.critical, "h0 nics out");
  // Copies cheaper than sends: on h0's one core the send takes 1 CPU-us per
  // byte and the copy 0.25; both go at the fair rate x with 1.25 x = 1 MB/s.
  const Topology cheap = Parsed(
      "hosts 2\ngpus_per_host 1\nnics_per_host 1\nnic 1MB/s\npcie 4MB/s\nagent_cores 1\n"
      "cpu_per_byte 1s/MB\ncpu_per_local_byte 0.25s/MB\nhost_copy 100MB/s\n");
  const ScaleResult r3 = Split("h1", 0).Run(cheap, DataPlane::kHostStaged);
  EXPECT_DOUBLE_EQ(r3.move.seconds, kHalf / 0.8e6);
  EXPECT_DOUBLE_EQ(r3.move.bound_seconds, kHalf / 0.8e6);
  EXPECT_EQ(r3.move.critical, "h0 agent cores");
}

TEST(ScaleSimTest, RefusesLayoutsBeyondTheTopology) {
  const Split s("h1", 1);
  absl::StatusOr<ScaleResult> r =
      SimulateScale(s.plan, s.from, s.to, Parsed("hosts 1\ngpus_per_host 2\nnics_per_host 2\n"),
                    DataPlane::kDirect);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "the layouts use 2 hosts; the topology has 1");
  r = SimulateScale(s.plan, s.from, s.to, Parsed("hosts 2\ngpus_per_host 1\nnics_per_host 1\n"),
                    DataPlane::kDirect);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "host h1 device 1: the topology has gpus_per_host 1");
}

}  // namespace
}  // namespace reshard::cost
