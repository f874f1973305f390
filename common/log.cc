#include "common/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace reshard {
namespace {
std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};

const char* SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kDebug:
      return "D";
    case LogSeverity::kInfo:
      return "I";
    case LogSeverity::kWarning:
      return "W";
    case LogSeverity::kError:
      return "E";
    case LogSeverity::kFatal:
      return "F";
  }
  return "?";
}

const char* Basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}
}  // namespace

void SetMinLogSeverity(LogSeverity s) { g_min_severity = static_cast<int>(s); }
LogSeverity MinLogSeverity() { return static_cast<LogSeverity>(g_min_severity.load()); }

bool ParseLogSeverity(const std::string& text, LogSeverity* out) {
  if (text == "debug")
    *out = LogSeverity::kDebug;
  else if (text == "info")
    *out = LogSeverity::kInfo;
  else if (text == "warning")
    *out = LogSeverity::kWarning;
  else if (text == "error")
    *out = LogSeverity::kError;
  else
    return false;
  return true;
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity) : severity_(severity) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  gmtime_r(&tv.tv_sec, &t);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%02d%02d %02d:%02d:%02d.%06ld", SeverityLetter(severity),
                t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                static_cast<long>(tv.tv_usec));
  stream_ << buf << " " << getpid() << " " << Basename(file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  const std::string s = stream_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
  if (severity_ == LogSeverity::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace reshard
