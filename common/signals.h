// Orderly shutdown on SIGTERM / SIGINT for the service binaries.
#pragma once

namespace reshard {

/// Blocks SIGTERM and SIGINT in the calling thread (call it in main() before
/// starting any thread: every thread inherits the mask, so the signals reach
/// only WaitForTerminationSignal and shutdown runs on an ordinary thread), and
/// ignores SIGPIPE.
void BlockTerminationSignals();

/// Waits for SIGTERM or SIGINT (blocked by BlockTerminationSignals) and
/// returns its number.
int WaitForTerminationSignal();

}  // namespace reshard
