// Minimal logging and invariant checks.
//
// Debian 12's Abseil (20220623) predates absl/log, so this provides the
// subset we use with the same shape: RESHARD_LOG(INFO) << ...; and
// RESHARD_CHECK(cond) << ...; which aborts on a broken invariant. Thread-safe:
// each message is written with one call.
#pragma once

#include <sstream>
#include <string>

namespace reshard {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

/// Messages below this severity are dropped. Set once at start-up.
void SetMinLogSeverity(LogSeverity s);
LogSeverity MinLogSeverity();
/// Parses "debug", "info", "warning", "error"; false on anything else.
bool ParseLogSeverity(const std::string& text, LogSeverity* out);

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows the stream when the message is below the minimum severity.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace reshard

#define RESHARD_LOG_SEVERITY_DEBUG ::reshard::LogSeverity::kDebug
#define RESHARD_LOG_SEVERITY_INFO ::reshard::LogSeverity::kInfo
#define RESHARD_LOG_SEVERITY_WARNING ::reshard::LogSeverity::kWarning
#define RESHARD_LOG_SEVERITY_ERROR ::reshard::LogSeverity::kError
#define RESHARD_LOG_SEVERITY_FATAL ::reshard::LogSeverity::kFatal

#define RESHARD_LOG(sev)                                     \
  (RESHARD_LOG_SEVERITY_##sev < ::reshard::MinLogSeverity()) \
      ? (void)0                                              \
      : ::reshard::LogVoidify() &                            \
            ::reshard::LogMessage(__FILE__, __LINE__, RESHARD_LOG_SEVERITY_##sev).stream()

#define RESHARD_CHECK(cond)                                                                       \
  (cond) ? (void)0                                                                                \
         : ::reshard::LogVoidify() &                                                              \
               ::reshard::LogMessage(__FILE__, __LINE__, ::reshard::LogSeverity::kFatal).stream() \
                   << "Check failed: " #cond " "
