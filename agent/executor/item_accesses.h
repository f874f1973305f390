// How many times a task run touches each item, counted before any byte
// moves: ItemChecks (item_checks.h) runs an item's check once that many
// accesses are over, so a count that is too low checks an item before its
// last write lands (or its last read is done), and one too high never checks
// it. One access per chunk of a cross-host step (its source item on the
// sender, each destination item on the receiver), per local step (its
// source and each destination) and per zero fill; every new item is counted,
// untouched ones 0 (checksummed at once). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "agent/executor/host_steps.h"
#include "agent/executor/item_checks.h"
#include "agent/executor/step_chunks.h"

namespace reshard::agent {

/// The kind of an ItemChecks key: an item of an old (source) rank buffer,
/// checked against its sealed checksum, or of a new rank buffer, checksummed.
enum ItemKind : int { kSourceItem = 0, kNewItem = 1 };

/// The accesses of every item of `hs`, `remote_chunks[i]` the chunks of
/// `hs.remotes[i]`.
std::map<ItemChecks::Key, int64_t> CountItemAccesses(const HostSteps& hs,
                                                     const std::vector<StepChunks>& remote_chunks);

}  // namespace reshard::agent
