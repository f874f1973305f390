// The route of each host's task (issue 23; docs/coordinator.md, "The route of
// each host's task"): what an agent reports in ReportProgressRequest.route /
// route_reason reaches GetOperation's Operation.hosts, on both stores; a
// report without a route keeps the stored one.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;

class HostRouteTest : public LogicTest {
 protected:
  absl::Status Report(const std::string& host, const std::string& op_id, int64_t bytes_done,
                      const std::string& route, const std::string& reason) {
    v1::ReportProgressRequest r;
    r.set_host_id(host);
    r.set_operation_id(op_id);
    r.set_state(v1::HOST_TASK_STATE_RUNNING);
    r.set_bytes_done(bytes_done);
    r.set_route(route);
    r.set_route_reason(reason);
    return agents_->ReportProgress(r).status();
  }

  static const v1::OperationHost* HostOf(const v1::Operation& op, const std::string& host) {
    for (const v1::OperationHost& h : op.hosts()) {
      if (h.host_id() == host) return &h;
    }
    return nullptr;
  }
};

TEST_P(HostRouteTest, ReportedRoutesReachGetOperationAndAnEmptyReportKeepsThem) {
  const v1::Job job = Register(TwoLayerJob("routes"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation started = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  const std::vector<std::string> hosts = Participants(started.id());
  ASSERT_EQ(hosts, (std::vector<std::string>{"h0", "h1", "h2"}));

  // Before any report: every host listed, no route yet.
  v1::Operation op = Op(started.id());
  ASSERT_EQ(op.hosts_size(), 3) << op.ShortDebugString();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(op.hosts(i).host_id(), hosts[i]);
    EXPECT_EQ(op.hosts(i).state(), v1::HOST_TASK_STATE_ASSIGNED);
    EXPECT_EQ(op.hosts(i).route(), "");
  }

  const std::string why = "host \"h2\" does not advertise fake-nccl";
  ASSERT_TRUE(Report("h1", started.id(), 0, "device-comm fake-nccl", "").ok());
  ASSERT_TRUE(Report("h2", started.id(), 0, "host-staged", why).ok());
  op = Op(started.id());
  const v1::OperationHost* h1 = HostOf(op, "h1");
  const v1::OperationHost* h2 = HostOf(op, "h2");
  ASSERT_NE(h1, nullptr);
  ASSERT_NE(h2, nullptr);
  EXPECT_EQ(h1->route(), "device-comm fake-nccl");
  EXPECT_EQ(h1->route_reason(), "");
  EXPECT_EQ(h1->state(), v1::HOST_TASK_STATE_RUNNING);
  EXPECT_EQ(h2->route(), "host-staged");
  EXPECT_EQ(h2->route_reason(), why);
  EXPECT_EQ(HostOf(op, "h0")->route(), "");

  // A report without a route (an agent before routing, or an older one)
  // keeps what is stored; its bytes still count.
  const int64_t h2_total = h2->bytes_total();
  ASSERT_GT(h2_total, 0);
  ASSERT_TRUE(Report("h2", started.id(), 1, "", "").ok());
  op = Op(started.id());
  EXPECT_EQ(HostOf(op, "h2")->route(), "host-staged");
  EXPECT_EQ(HostOf(op, "h2")->route_reason(), why);
  EXPECT_EQ(HostOf(op, "h2")->bytes_done(), 1);
  EXPECT_EQ(HostOf(op, "h2")->bytes_total(), h2_total);

  // A new route replaces the old one and its reason.
  ASSERT_TRUE(Report("h2", started.id(), 1, "device-direct", "").ok());
  op = Op(started.id());
  EXPECT_EQ(HostOf(op, "h2")->route(), "device-direct");
  EXPECT_EQ(HostOf(op, "h2")->route_reason(), "");

  // DONE (CompleteTask sends no route) keeps the route the task ran on.
  CompleteTask("h1", started.id());
  op = Op(started.id());
  EXPECT_EQ(HostOf(op, "h1")->state(), v1::HOST_TASK_STATE_DONE);
  EXPECT_EQ(HostOf(op, "h1")->route(), "device-comm fake-nccl");
}

RESHARD_LOGIC_ON_BOTH_STORES(HostRouteTest);

}  // namespace
}  // namespace reshard::coordinator::testing
