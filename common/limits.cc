#include "common/limits.h"

#include "absl/strings/str_cat.h"

namespace reshard {

absl::Status CheckLength(absl::string_view field, absl::string_view value, int64_t limit) {
  if (static_cast<int64_t>(value.size()) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " \"", value.substr(0, 64), "...\" is ",
                                                 value.size(), " bytes; the limit is ", limit,
                                                 " bytes"));
}

}  // namespace reshard
