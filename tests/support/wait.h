// Waiting for an event in a test without sleeping as synchronisation: poll a
// condition with a deadline. The one waiter every suite uses (tests/support,
// the library shared by the suites: reshard_test_support).
#pragma once

#include <functional>

#include "absl/time/time.h"

namespace reshard::test_support {

/// Calls `done` every `period` until it returns true or `timeout` passes;
/// whether it returned true. `done` is called at least once, and once more
/// at or after the deadline, so a condition that holds by then is seen.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30),
                absl::Duration period = absl::Milliseconds(50));

}  // namespace reshard::test_support
