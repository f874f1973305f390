// Time, injected so logic can be tested without sleeping.
#pragma once

#include <chrono>
#include <cstdint>

namespace reshard::coordinator {

/// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowUnixMs() const = 0;
};

class SystemClock : public Clock {
 public:
  int64_t NowUnixMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace reshard::coordinator
