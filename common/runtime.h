// What a service binary sets up about its libraries before its first thread.
#pragma once

namespace reshard {

/// Turns off the debugging checks the distribution's Abseil keeps on in
/// production binaries. Debian builds Abseil without NDEBUG, so every
/// absl::Mutex lock (gRPC takes several per call) is recorded in one
/// process-wide lock-order graph behind one global lock, to report a
/// potential deadlock: at 10,000 hosts that bookkeeping alone took 4 % of the
/// coordinator's CPU. Our own code uses std::mutex. Call it in main() before
/// starting any thread. (gRPC's own debug check, a scan of every outstanding
/// completion-queue tag per completion, has no switch: docs/coordinator.md,
/// "Capacity: what is read per call at 10,000 hosts".)
void UseReleaseRuntime();

}  // namespace reshard
