#include "client/cli/json_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"

namespace reshard::cli {
namespace {

// Protobuf's parse errors quote the input over several lines; keep one.
std::string OneLine(absl::string_view text) {
  std::string out(absl::StripAsciiWhitespace(text));
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot read \"", path, "\""));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", path, "\" is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open \"", path, "\""));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error while reading \"", path, "\""));
  }
  return contents.str();
}

absl::Status ReadJsonMessage(const std::string& path, absl::string_view what,
                             google::protobuf::Message* message) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*text, message, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": \"", path, "\" is not a valid ", message->GetDescriptor()->full_name(),
        " in JSON: ", OneLine(std::string(parsed.message()))));
  }
  return absl::OkStatus();
}

}  // namespace reshard::cli
