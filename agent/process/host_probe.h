// The agent's registration probe (docs/agent.md, "Registration probe"): its
// copy and hash rates, measured once at start-up, which the coordinator's
// cost model assumes for this host until a committed operation teaches it
// better (v1::HostProbe).
#pragma once

#include <cstdint>

#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// The machine (its boot id) and the CPUs this process may use; then, with
/// `bytes` > 0, copies them into freshly mapped pages (what making a new
/// buffer and filling it costs) and hashes them with XXH3 (what sealing
/// costs), each timed once (--probe-bytes, 32 MiB by default: about 15 ms
/// on a server core).
v1::HostProbe MeasureHostProbe(int64_t bytes);

}  // namespace reshard::agent
