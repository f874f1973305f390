#include "services/coordinator/logic/error_text.h"

#include "absl/strings/str_cat.h"

namespace reshard::coordinator {

std::string TruncateError(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  // The note is at most ~40 bytes; keep room for it inside the limit.
  constexpr size_t kNoteRoom = 48;
  size_t keep = max_bytes > kNoteRoom ? max_bytes - kNoteRoom : 0;
  // Step back over UTF-8 continuation bytes (10xxxxxx) so that no character
  // is split: the text goes into a proto string field, which must be UTF-8.
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  std::string out(text.substr(0, keep));
  absl::StrAppend(&out, "... (", text.size() - keep, " more bytes)");
  if (out.size() > max_bytes) out.resize(max_bytes);  // only for tiny limits
  return out;
}

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

absl::Status OperationNotFound(const std::string& operation_id) {
  return absl::NotFoundError(absl::StrCat("operation \"", operation_id, "\" not found"));
}

absl::Status HostNotFound(const std::string& host_id) {
  return absl::NotFoundError(absl::StrCat("host \"", host_id, "\" not found"));
}

absl::Status NameNotFound(const absl::Status& status, const absl::Status& not_found) {
  return absl::IsNotFound(status) ? not_found : status;
}

}  // namespace reshard::coordinator
