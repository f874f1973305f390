#include "agent/executor/transfer_lanes.h"

#include <map>
#include <utility>

#include "common/log.h"

namespace reshard::agent {

TransferLanes::TransferLanes(const std::vector<Step>& steps, int64_t lane_window_bytes,
                             int64_t total_window_bytes)
    : steps_(steps), lane_window_(lane_window_bytes), total_window_(total_window_bytes) {
  RESHARD_CHECK(lane_window_ > 0) << "lane window " << lane_window_;
  RESHARD_CHECK(total_window_ > 0) << "total window " << total_window_;
  std::map<std::pair<std::string, bool>, size_t> lane_of;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    auto [it, added] = lane_of.emplace(std::make_pair(s.peer, s.is_send), lanes_.size());
    if (added) {
      Lane l;
      l.peer = s.peer;
      l.is_send = s.is_send;
      lanes_.push_back(std::move(l));
    }
    lanes_[it->second].steps.push_back(i);
    chunk_count_ += static_cast<int64_t>(s.chunk_bytes.size());
  }
}

bool TransferLanes::Ready(Lane& lane) const {
  while (lane.next_step < lane.steps.size() &&
         lane.next_chunk >=
             static_cast<int64_t>(steps_[lane.steps[lane.next_step]].chunk_bytes.size())) {
    ++lane.next_step;
    lane.next_chunk = 0;
  }
  return lane.next_step < lane.steps.size();
}

std::optional<TransferLanes::Chunk> TransferLanes::Next() {
  for (size_t k = 0; k < lanes_.size(); ++k) {
    const size_t li = (cursor_ + k) % lanes_.size();
    Lane& lane = lanes_[li];
    if (!Ready(lane)) continue;
    const size_t step = lane.steps[lane.next_step];
    const int64_t bytes = steps_[step].chunk_bytes[lane.next_chunk];
    // A lane with nothing in flight always issues: then, as both ends issue a
    // lane in the same order, its earliest unfinished chunk is posted at both
    // ends whatever the other lanes do, and no cycle of full windows between
    // hosts can stop the transfer (see the header).
    const bool idle = lane.inflight == 0;
    const bool lane_fits = lane.inflight + bytes <= lane_window_;
    const bool total_fits = inflight_ + bytes <= total_window_;
    if (!idle && (!lane_fits || !total_fits)) continue;
    Chunk c{step, lane.next_chunk, li, bytes};
    ++lane.next_chunk;
    lane.inflight += bytes;
    inflight_ += bytes;
    cursor_ = (li + 1) % lanes_.size();
    return c;
  }
  return std::nullopt;
}

void TransferLanes::Done(const Chunk& c) {
  Lane& lane = lanes_[c.lane];
  RESHARD_CHECK(lane.inflight >= c.bytes && inflight_ >= c.bytes);
  lane.inflight -= c.bytes;
  inflight_ -= c.bytes;
}

}  // namespace reshard::agent
