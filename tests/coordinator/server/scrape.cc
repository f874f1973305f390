#include "tests/coordinator/server/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace reshard::coordinator::testing {
namespace {

// Parses `name{a="x",b="y"} value` (or `name value`); false for comments
// and anything malformed.
bool ParseSample(const std::string& line, std::string* name,
                 std::map<std::string, std::string>* labels, double* value) {
  if (line.empty() || line[0] == '#') return false;
  labels->clear();
  size_t i = line.find_first_of("{ ");
  if (i == std::string::npos) return false;
  *name = line.substr(0, i);
  if (line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
      const std::string key = line.substr(i, eq - i);
      std::string val;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) ++j;
        val.push_back(line[j]);
      }
      if (j >= line.size()) return false;
      (*labels)[key] = val;
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return false;
    ++i;  // '}'
  }
  const std::string rest = line.substr(i);
  char* end = nullptr;
  *value = std::strtod(rest.c_str(), &end);
  return end != rest.c_str();
}

}  // namespace

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", strerror(err)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string response;
  char buf[8192];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) return absl::UnavailableError("no HTTP header end");
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200")) {
    return absl::UnavailableError(absl::StrCat("HTTP status: ", status_line));
  }
  return response.substr(header_end + 4);
}

std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::map<std::string, std::string>& labels) {
  std::istringstream in(exposition);
  std::string line, sample_name;
  std::map<std::string, std::string> sample_labels;
  double value = 0, sum = 0;
  bool found = false;
  while (std::getline(in, line)) {
    if (!ParseSample(line, &sample_name, &sample_labels, &value) || sample_name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = sample_labels.find(k);
      if (it == sample_labels.end() || it->second != v) {
        match = false;
        break;
      }
    }
    if (!match) continue;
    sum += value;
    found = true;
  }
  if (!found) return std::nullopt;
  return sum;
}

std::optional<double> ScrapeLeader(int metrics_port) {
  absl::StatusOr<std::string> body = HttpGet(metrics_port, "/metrics");
  if (!body.ok()) return std::nullopt;
  return MetricValue(*body, "reshard_coordinator_leader");
}

}  // namespace reshard::coordinator::testing
