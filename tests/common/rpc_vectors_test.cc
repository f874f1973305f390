// common/rpc (status names, the retry table, backoff, enum short names)
// against the shared test vectors of tests/data/rpc_vectors.json, written by
// the Python implementation (client/python/reshard/core/_rpc.py through
// tests/data/gen_rpc_vectors.py): both sides must agree on every row.
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "common/rpc/enum_name.h"
#include "common/rpc/retry.h"
#include "common/rpc/status.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "tests/data/vectors.h"

namespace reshard::rpc {
namespace {

using test_vectors::Bool;
using test_vectors::Int;
using test_vectors::ListValue;
using test_vectors::Number;
using test_vectors::Struct;
using test_vectors::Text;
using test_vectors::Value;

#ifndef RESHARD_RPC_VECTORS
#error "RESHARD_RPC_VECTORS must name tests/data/rpc_vectors.json"
#endif

const Struct& Vectors() {
  static const Struct* root = new Struct(test_vectors::Load(RESHARD_RPC_VECTORS));
  return *root;
}
const ListValue& List(const std::string& key) { return test_vectors::List(Vectors(), key); }

// The Python names of the kinds (reshard._rpc.CALL_KINDS).
CallKind KindOf(const std::string& name) {
  static const auto* kinds =
      new std::map<std::string, CallKind>{{"client_call", CallKind::kClientCall},
                                          {"unkeyed_mutation", CallKind::kUnkeyedMutation},
                                          {"agent_call", CallKind::kAgentCall},
                                          {"stream_reconnect", CallKind::kStreamReconnect},
                                          {"worker_publish", CallKind::kWorkerPublish}};
  auto it = kinds->find(name);
  EXPECT_NE(it, kinds->end()) << "unknown call kind \"" << name << "\"";
  return it == kinds->end() ? CallKind::kUnkeyedMutation : it->second;
}

absl::StatusCode CodeOf(int64_t number) { return static_cast<absl::StatusCode>(number); }

TEST(RpcVectorsTest, Version) {
  const auto& fields = Vectors().fields();
  ASSERT_EQ(fields.count("version"), 1u);
  EXPECT_EQ(fields.at("version").number_value(), 1);
}

TEST(RpcVectorsTest, CodeNames) {
  const ListValue& rows = List("codes");
  ASSERT_EQ(rows.values_size(), 19);
  for (const Value& row : rows.values()) {
    const int64_t number = Int(row, "number");
    SCOPED_TRACE(number);
    EXPECT_EQ(CodeName(CodeOf(number)), Text(row, "name"));
    // A number on the wire (WorkerFdResponse.code): out of range is UNKNOWN.
    const absl::Status wire = FromWireCode(number, "what went wrong");
    EXPECT_EQ(CodeName(wire.code()), Text(row, "wire"));
    if (wire.ok()) {
      EXPECT_EQ(number, 0);
    } else {
      EXPECT_EQ(wire.message(), "what went wrong");
    }
    if (number >= 0 && number <= 16) {
      EXPECT_EQ(ToWireCode(CodeOf(number)), number);
      EXPECT_EQ(Text(row, "wire"), Text(row, "name"));
      EXPECT_EQ(IsWatchRefusal(CodeOf(number)), Bool(row, "watch_refusal"));
      EXPECT_EQ(IsSilence(CodeOf(number)), Bool(row, "silence"));
    }
  }
}

TEST(RpcVectorsTest, Policies) {
  const ListValue& rows = List("policies");
  ASSERT_EQ(rows.values_size(), 5);
  std::set<std::string> kinds;
  for (const Value& row : rows.values()) {
    const std::string& kind = Text(row, "kind");
    SCOPED_TRACE(kind);
    kinds.insert(kind);
    const RetryPolicy& p = DefaultPolicy(KindOf(kind));
    EXPECT_EQ(p.max_attempts, Int(row, "max_attempts"));
    EXPECT_EQ(absl::ToInt64Microseconds(p.initial_backoff), Int(row, "initial_backoff_us"));
    EXPECT_EQ(absl::ToInt64Microseconds(p.max_backoff), Int(row, "max_backoff_us"));
    EXPECT_EQ(p.multiplier, Number(row, "multiplier"));
    EXPECT_EQ(p.jitter, Number(row, "jitter"));
  }
  EXPECT_EQ(kinds.size(), 5u);
}

TEST(RpcVectorsTest, Retryable) {
  const ListValue& rows = List("retryable");
  ASSERT_EQ(rows.values_size(), 17 * 5);
  for (const Value& row : rows.values()) {
    SCOPED_TRACE(Text(row, "kind") + " " + CodeName(CodeOf(Int(row, "code"))));
    EXPECT_EQ(IsRetryable(KindOf(Text(row, "kind")), CodeOf(Int(row, "code"))),
              Bool(row, "retryable"));
  }
}

TEST(RpcVectorsTest, Backoff) {
  const ListValue& rows = List("backoff");
  ASSERT_EQ(rows.values_size(), 5 * 12 * 4);
  for (const Value& row : rows.values()) {
    const RetryPolicy& p = DefaultPolicy(KindOf(Text(row, "kind")));
    const int attempt = static_cast<int>(Int(row, "attempt"));
    const double u = Number(row, "u");
    SCOPED_TRACE(Text(row, "kind") + " attempt " + std::to_string(attempt) + " u " +
                 std::to_string(u));
    EXPECT_EQ(absl::ToInt64Microseconds(BaseBackoff(p, attempt)), Int(row, "base_micros"));
    EXPECT_EQ(absl::ToInt64Microseconds(BackoffAt(p, attempt, u)), Int(row, "micros"));
  }
}

TEST(RpcVectorsTest, EnumShortNames) {
  // Linked in so that the generated pool knows the enums the rows name.
  const std::map<std::string, const google::protobuf::EnumDescriptor*> enums = {
      {"reshard.v1.OperationState", v1::OperationState_descriptor()},
      {"reshard.v1.OperationKind", v1::OperationKind_descriptor()},
      {"reshard.v1.JobState", v1::JobState_descriptor()},
      {"reshard.v1.HostState", v1::HostState_descriptor()},
      {"reshard.v1.HostTaskState", v1::HostTaskState_descriptor()},
      {"reshard.v1.StepBoundary", v1::StepBoundary_descriptor()},
      {"reshard.v1.TpMode", v1::TpMode_descriptor()}};
  const ListValue& rows = List("enum_names");
  ASSERT_GT(rows.values_size(), 0);
  std::map<std::string, int> seen;
  for (const Value& row : rows.values()) {
    const std::string& name = Text(row, "enum");
    const int value = static_cast<int>(Int(row, "value"));
    SCOPED_TRACE(name + " " + std::to_string(value));
    auto it = enums.find(name);
    ASSERT_NE(it, enums.end());
    ++seen[name];
    EXPECT_EQ(EnumShortName(it->second, value), Text(row, "upper"));
    EXPECT_EQ(EnumShortName(it->second, value, NameCase::kLower), Text(row, "lower"));
  }
  // Every value of each enum, and one it lacks.
  for (const auto& [name, descriptor] : enums) {
    EXPECT_EQ(seen[name], descriptor->value_count() + 1) << name;
  }
}

}  // namespace
}  // namespace reshard::rpc
