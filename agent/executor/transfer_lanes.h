// The order in which one host hands its cross-host chunks to the transport.
// Chunks are grouped into lanes, one per (peer, direction); within a lane
// they keep step-index order, which both ends of the lane derive alike, so
// every receive the receiver posts matches the next chunks its sender sends.
// Across lanes the chunks are interleaved round robin, and each lane has its
// own window of bytes in flight: on per-host links a sender that walked its
// plan in plan order (every chunk for one peer, then the next) kept all
// senders on the same receiver's link at once and left the others idle.
// See docs/agent.md, "Executing a HostTask". Pure; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace reshard::agent {

class TransferLanes {
 public:
  /// One remote step as the lanes see it: its lane (other end, direction) and
  /// the bytes of each of its chunks in order.
  struct Step {
    std::string peer;
    bool is_send = false;
    std::vector<int64_t> chunk_bytes;
  };
  /// A chunk to issue: step `step` (an index into the steps given), chunk
  /// `chunk`, in lane `lane`.
  struct Chunk {
    size_t step = 0;
    int64_t chunk = 0;
    size_t lane = 0;
    int64_t bytes = 0;
  };

  /// `steps` in step-index order. A lane issues while its bytes in flight
  /// stay within `lane_window_bytes` and all lanes' within
  /// `total_window_bytes`; a lane with nothing in flight always issues one
  /// chunk, whatever the total. That keeps the transfer deadlock-free: the
  /// earliest unfinished chunk of every lane is posted at both its ends (had
  /// the total window a say over idle lanes, host A could wait on B's
  /// receives, B on C's sends and C on A's sends, every window full). The
  /// total can therefore exceed `total_window_bytes` by up to one chunk per
  /// lane. Both windows must be positive.
  TransferLanes(const std::vector<Step>& steps, int64_t lane_window_bytes,
                int64_t total_window_bytes);

  /// The next chunk to hand to the transport, taking lanes in turn (the lane
  /// after the one that issued last first); nullopt when every lane is
  /// finished or at its window. The chunk counts as in flight until Done.
  std::optional<Chunk> Next();
  /// Chunk `c` (returned by Next) completed.
  void Done(const Chunk& c);

  size_t lane_count() const { return lanes_.size(); }
  /// The lane of a (peer, direction); lanes are numbered in order of first
  /// appearance in the steps.
  const std::string& lane_peer(size_t lane) const { return lanes_[lane].peer; }
  bool lane_is_send(size_t lane) const { return lanes_[lane].is_send; }
  /// Total chunks over all steps.
  int64_t chunk_count() const { return chunk_count_; }

 private:
  struct Lane {
    std::string peer;
    bool is_send = false;
    std::vector<size_t> steps;  // in step-index order
    size_t next_step = 0;       // position in `steps` of the next chunk
    int64_t next_chunk = 0;
    int64_t inflight = 0;
  };
  // Moves `lane`'s cursor past steps without chunks; false when it is finished.
  bool Ready(Lane& lane) const;

  std::vector<Step> steps_;
  std::vector<Lane> lanes_;
  int64_t lane_window_;
  int64_t total_window_;
  int64_t inflight_ = 0;
  int64_t chunk_count_ = 0;
  size_t cursor_ = 0;  // the lane asked first by the next Next
};

}  // namespace reshard::agent
