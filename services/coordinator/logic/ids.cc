#include "services/coordinator/logic/ids.h"

#include <cstdint>
#include <random>

namespace reshard::coordinator {

std::string NewId() {
  // std::random_device reads the kernel's CSPRNG (getrandom); one per thread
  // so the request path takes no lock. Ids are minted a few per request, so
  // its cost does not matter.
  thread_local std::random_device device;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (int word = 0; word < 4; ++word) {
    uint32_t bits = device();
    for (int i = 0; i < 8; ++i) {
      id[word * 8 + i] = kHex[bits & 0xf];
      bits >>= 4;
    }
  }
  return id;
}

bool LooksLikeId(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace reshard::coordinator
