// Identifiers the coordinator mints for jobs and operations. Thread-safe.
#pragma once

#include <string>

namespace reshard::coordinator {

/// 32 random lowercase hex characters (128 bits from the OS entropy pool),
/// so ids from different replicas never collide and are not guessable.
std::string NewId();

/// Whether `id` has the shape NewId() produces.
bool LooksLikeId(const std::string& id);

}  // namespace reshard::coordinator
