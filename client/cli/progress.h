// The live progress of an operation on stderr while reshardctl waits: a bar
// redrawn in place on a terminal, periodic plain lines otherwise. Reads the
// clock; not thread-safe (fed from one watch callback).
#pragma once

#include <chrono>
#include <ostream>
#include <string>

#include "reshard/v1/coordinator.pb.h"

namespace reshard::cli {

class ProgressReporter {
 public:
  /// `tty`: redraw one line with a bar; else print a line on every state
  /// change and at most every `line_interval` in between.
  ProgressReporter(std::ostream& err, bool tty,
                   std::chrono::milliseconds line_interval = std::chrono::seconds(2));

  /// A new view of the operation (from WatchOperation).
  void Update(const v1::Operation& op);
  /// Ends the bar's line (terminal); idempotent.
  void Finish();

 private:
  using Clock = std::chrono::steady_clock;

  std::ostream& err_;
  const bool tty_;
  const std::chrono::milliseconds line_interval_;
  const Clock::time_point start_ = Clock::now();
  // First sample while TRANSFERRING, for the average rate.
  bool have_base_ = false;
  Clock::time_point base_time_;
  int64_t base_bytes_ = 0;
  v1::OperationState last_state_ = v1::OPERATION_STATE_UNSPECIFIED;
  Clock::time_point last_line_;
  bool drawn_ = false;  // a bar is on the terminal's current line
};

}  // namespace reshard::cli
