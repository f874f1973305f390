#include "agent/executor/item_accesses.h"

namespace reshard::agent {

std::map<ItemChecks::Key, int64_t> CountItemAccesses(const HostSteps& hs,
                                                     const std::vector<StepChunks>& remote_chunks) {
  std::map<ItemChecks::Key, int64_t> n;
  for (size_t k = 0; k < hs.new_ranks.size(); ++k) {
    for (size_t item = 0; item < hs.new_item_bytes[k].size(); ++item) {
      n[{kNewItem, hs.new_ranks[k], static_cast<int>(item)}] += 0;
    }
  }
  for (const v1::ZeroFill* f : hs.fills) ++n[{kNewItem, f->rank(), f->item()}];
  for (const v1::CopyStep* step : hs.locals) {
    ++n[{kSourceItem, step->src_rank(), step->item()}];
    for (const auto& d : step->dsts()) ++n[{kNewItem, d.rank(), step->item()}];
  }
  for (size_t i = 0; i < hs.remotes.size(); ++i) {
    const v1::CopyStep& step = *hs.remotes[i].step;
    const int64_t chunks = remote_chunks[i].count();
    if (hs.remotes[i].is_send) {
      n[{kSourceItem, step.src_rank(), step.item()}] += chunks;
    } else {
      for (const auto& d : step.dsts()) n[{kNewItem, d.rank(), step.item()}] += chunks;
    }
  }
  return n;
}

}  // namespace reshard::agent
