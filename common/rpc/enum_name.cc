#include "common/rpc/enum_name.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace reshard::rpc {

namespace {

// "OperationState" -> "OPERATION_STATE_": an underscore before each capital
// that follows a lower-case letter or a digit.
std::string ValuePrefix(const std::string& type_name) {
  std::string prefix;
  for (size_t i = 0; i < type_name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(type_name[i]);
    if (i > 0 && std::isupper(c)) {
      const unsigned char prev = static_cast<unsigned char>(type_name[i - 1]);
      if (std::islower(prev) || std::isdigit(prev)) prefix += '_';
    }
    prefix += static_cast<char>(std::toupper(c));
  }
  prefix += '_';
  return prefix;
}

}  // namespace

std::string EnumShortName(const google::protobuf::EnumDescriptor* descriptor, int value,
                          NameCase name_case) {
  const google::protobuf::EnumValueDescriptor* v = descriptor->FindValueByNumber(value);
  std::string name;
  if (v == nullptr) {
    name = absl::StrCat("UNKNOWN_", value);
  } else {
    name = std::string(v->name());
    const std::string prefix = ValuePrefix(std::string(descriptor->name()));
    bool shared = true;
    for (int i = 0; i < descriptor->value_count() && shared; ++i) {
      shared = absl::StartsWith(descriptor->value(i)->name(), prefix);
    }
    if (shared) name.erase(0, prefix.size());
  }
  if (name_case == NameCase::kLower) absl::AsciiStrToLower(&name);
  return name;
}

}  // namespace reshard::rpc
