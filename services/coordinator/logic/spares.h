// Spare hosts, as a host notice and an elastic policy use them
// (docs/scheduler.md, "Host notices", "Elastic policies"): which of the
// hosts offered are there to take ranks, and a layout with one host's
// ranks moved onto a spare.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/host_store.h"

namespace reshard::coordinator {

/// A registered, ALIVE host offered as a spare.
struct Spare {
  std::string host;
  /// Its accelerators' indexes, ascending; empty when its agent keeps state
  /// in host memory (it reports one "cpu" device, which is no slot).
  std::vector<int> devices;
};

/// `names` as a list of spares in the request field `field`: no empty
/// name, none twice, not `leaving` (when given). INVALID_ARGUMENT naming
/// the field and the host.
[[nodiscard]] absl::Status CheckSpareHosts(
    absl::string_view field, const google::protobuf::RepeatedPtrField<std::string>& names,
    const std::string& leaving = "");

/// The hosts of `names`, in order, that are registered, ALIVE and without
/// a host notice (Host.leaves_unix_ms).
[[nodiscard]] absl::StatusOr<std::vector<Spare>> AliveSpares(
    HostStore& hosts, const google::protobuf::RepeatedPtrField<std::string>& names);

/// `layout` with the ranks on `leaving` moved onto `spare`, in the order of
/// the devices they used there (the same config): onto the spare's
/// accelerators in order, or without any onto the same device indexes.
/// nullopt when `layout` uses the spare already or it has too few
/// accelerators.
std::optional<v1::Layout> OntoSpare(const v1::Layout& layout, const std::string& leaving,
                                    const Spare& spare);

}  // namespace reshard::coordinator
