// The coordinator suites' name for the shared waiter (tests/support/wait.h).
#pragma once

#include "tests/support/wait.h"

namespace reshard::coordinator::testing {

using ::reshard::test_support::Eventually;

}  // namespace reshard::coordinator::testing
