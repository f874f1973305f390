#include "agent/shard_store/sidecar.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace reshard::agent {
namespace {

constexpr char kMagic[] = "reshard-rank-buffer 1";

absl::Status ErrnoError(const std::string& what, const std::string& path, int err) {
  return absl::InternalError(absl::StrCat(what, " \"", path, "\": ", std::strerror(err)));
}

// Splits "<name> <value>" and checks the name.
bool Field(const std::string& line, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (line.size() < n + 1 || line.compare(0, n, name) != 0 || line[n] != ' ') return false;
  *value = line.substr(n + 1);
  return true;
}

}  // namespace

std::string SerializeSidecar(const Sidecar& s) {
  std::string out = absl::StrCat(kMagic, "\n");
  absl::StrAppend(&out, "host ", absl::CEscape(s.host_id), "\n");
  absl::StrAppend(&out, "job ", absl::CEscape(s.key.job_id), "\n");
  absl::StrAppend(&out, "generation ", s.key.generation, "\n");
  absl::StrAppend(&out, "rank ", s.key.rank, "\n");
  absl::StrAppend(&out, "sealed ", s.sealed ? 1 : 0, "\n");
  absl::StrAppend(&out, "published ", s.published ? 1 : 0, "\n");
  if (!s.regenerated.empty()) {
    absl::StrAppend(&out, "regenerated ", absl::StrJoin(s.regenerated, " "), "\n");
  }
  absl::StrAppend(&out, "items ", s.item_bytes.size(), "\n");
  for (size_t i = 0; i < s.item_bytes.size(); ++i) {
    absl::StrAppend(
        &out, "item ", s.item_bytes[i], " ",
        s.sealed ? absl::StrCat(absl::Hex(s.checksums[i], absl::kZeroPad16)) : std::string("-"),
        "\n");
  }
  absl::StrAppend(&out, "end\n");
  return out;
}

absl::StatusOr<Sidecar> ParseSidecar(const std::string& text) {
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  size_t next = 0;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("line ", next, ": ", what));
  };
  auto line = [&]() -> const std::string& {
    static const std::string kEmpty;
    return next < lines.size() ? lines[next++] : (++next, kEmpty);
  };
  Sidecar s;
  std::string v;
  if (line() != kMagic) return bad("not a rank buffer sidecar");
  if (!Field(line(), "host", &v) || !absl::CUnescape(v, &s.host_id)) return bad("bad host");
  if (!Field(line(), "job", &v) || !absl::CUnescape(v, &s.key.job_id)) return bad("bad job");
  if (!Field(line(), "generation", &v) || !absl::SimpleAtoi(v, &s.key.generation)) {
    return bad("bad generation");
  }
  if (!Field(line(), "rank", &v) || !absl::SimpleAtoi(v, &s.key.rank)) return bad("bad rank");
  int sealed = 0;
  if (!Field(line(), "sealed", &v) || !absl::SimpleAtoi(v, &sealed) ||
      (sealed != 0 && sealed != 1)) {
    return bad("bad sealed flag");
  }
  s.sealed = sealed == 1;
  int published = 0;
  if (next < lines.size() && Field(lines[next], "published", &v)) {
    ++next;
    if (!absl::SimpleAtoi(v, &published) || (published != 0 && published != 1)) {
      return bad("bad published flag");
    }
  }
  s.published = published == 1;
  if (next < lines.size() && Field(lines[next], "regenerated", &v)) {
    ++next;
    for (absl::string_view part : absl::StrSplit(v, ' ')) {
      int32_t item = 0;
      if (!absl::SimpleAtoi(part, &item) || item < 0 ||
          (!s.regenerated.empty() && item <= s.regenerated.back())) {
        return bad("bad regenerated items (ascending item indices)");
      }
      s.regenerated.push_back(item);
    }
  }
  int64_t count = 0;
  if (!Field(line(), "items", &v) || !absl::SimpleAtoi(v, &count) || count < 0 ||
      count > int64_t{1} << 24) {
    return bad("bad item count");
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!Field(line(), "item", &v)) return bad("missing item");
    const std::vector<std::string> parts = absl::StrSplit(v, ' ');
    int64_t bytes = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &bytes) || bytes < 0) {
      return bad("bad item");
    }
    s.item_bytes.push_back(bytes);
    if (!s.sealed) {
      if (parts[1] != "-") return bad("checksum in an unsealed buffer");
      continue;
    }
    uint64_t sum = 0;
    if (parts[1].size() != 16 || !absl::SimpleHexAtoi(parts[1], &sum)) return bad("bad checksum");
    s.checksums.push_back(sum);
  }
  if (!s.regenerated.empty() && s.regenerated.back() >= count) {
    return bad(absl::StrCat("regenerated item ", s.regenerated.back(), " of ", count, " items"));
  }
  if (line() != "end") return bad("missing end");
  return s;
}

absl::Status WriteSidecar(const std::string& path, const Sidecar& sidecar) {
  const std::string tmp = path + ".tmp";
  const std::string text = SerializeSidecar(sidecar);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoError("cannot write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("cannot sync", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("cannot rename to", path, err);
  }
  return absl::OkStatus();
}

absl::StatusOr<Sidecar> ReadSidecar(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError("cannot open", path, errno);
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<Sidecar> s = ParseSidecar(text.str());
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", path, "\": ", s.status().message()));
  }
  return s;
}

}  // namespace reshard::agent
