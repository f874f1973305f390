#include "client/cli/progress.h"

#include "client/cli/server_format.h"

namespace reshard::cli {

ProgressReporter::ProgressReporter(std::ostream& err, bool tty,
                                   std::chrono::milliseconds line_interval)
    : err_(err), tty_(tty), line_interval_(line_interval) {}

void ProgressReporter::Update(const v1::Operation& op) {
  const Clock::time_point now = Clock::now();
  if (op.state() == v1::OPERATION_STATE_TRANSFERRING && !have_base_) {
    have_base_ = true;
    base_time_ = now;
    base_bytes_ = op.bytes_done();
  }
  ProgressSample s;
  s.state = op.state();
  s.bytes_done = op.bytes_done();
  s.bytes_total = op.bytes_total();
  s.elapsed_s = std::chrono::duration<double>(now - start_).count();
  if (have_base_) {
    const double dt = std::chrono::duration<double>(now - base_time_).count();
    if (dt >= 0.2) s.rate_bytes_per_s = (op.bytes_done() - base_bytes_) / dt;
  }
  const bool state_changed = op.state() != last_state_;
  last_state_ = op.state();
  if (tty_) {
    err_ << "\r\033[K" << FormatProgressBar(s, 30) << std::flush;
    drawn_ = true;
    return;
  }
  if (state_changed || now - last_line_ >= line_interval_) {
    err_ << FormatProgressLine(op.id(), s) << "\n" << std::flush;
    last_line_ = now;
  }
}

void ProgressReporter::Finish() {
  if (tty_ && drawn_) err_ << "\n" << std::flush;
  drawn_ = false;
}

}  // namespace reshard::cli
