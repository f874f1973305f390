// Waiting for an event in a test without sleeping as synchronisation: poll
// a condition with a deadline.
#pragma once

#include <functional>

#include "absl/time/time.h"

namespace reshard::coordinator::testing {

/// Calls `done` every `period` until it returns true or `timeout` passes;
/// whether it returned true.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30),
                absl::Duration period = absl::Milliseconds(50));

}  // namespace reshard::coordinator::testing
