// Short names of proto enum values, from one rule: OPERATION_STATE_COMMITTED
// is "COMMITTED" (status messages, reshardctl) or "committed" (metric
// labels). Needs protobuf only, no gRPC, so that the store and the planner
// may use it. The Python SDK mirrors it (client/python/reshard/_rpc.py).
// Pure; thread-safe.
#pragma once

#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace reshard::rpc {

enum class NameCase { kUpper, kLower };

/// The name of `value` in enum `descriptor` without the prefix that the
/// enum's type name gives its values: UPPER_SNAKE(type name) + "_"
/// (OperationState -> "OPERATION_STATE_", HostTaskState ->
/// "HOST_TASK_STATE_"). The prefix is stripped only when every value of the
/// enum starts with it; else full names are kept (TpMode's TP_*). A value
/// not in the enum gives "UNKNOWN_<n>". kLower lowers the whole result.
std::string EnumShortName(const google::protobuf::EnumDescriptor* descriptor, int value,
                          NameCase name_case = NameCase::kUpper);

/// EnumShortName of a generated enum's value.
template <class E>
std::string EnumShortName(E value, NameCase name_case = NameCase::kUpper) {
  return EnumShortName(google::protobuf::GetEnumDescriptor<E>(), static_cast<int>(value),
                       name_case);
}

}  // namespace reshard::rpc
