// Compiled with -mavx2 (CMakeLists.txt): nothing here may be inline code
// other translation units could share (no C++ library headers), or the
// linker could hand AVX2 instructions to callers on a CPU without them.
#include "agent/executor/xxh3_avx2.h"

#if defined(__x86_64__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace reshard::agent::xxh3_avx2 {

struct State {
  XXH3_state_t* xxh;
};

State* Create() {
  State* s = new State{XXH3_createState()};
  if (s->xxh == nullptr || XXH3_64bits_reset(s->xxh) != XXH_OK) __builtin_trap();
  return s;
}

void Free(State* s) {
  XXH3_freeState(s->xxh);
  delete s;
}

void Update(State* s, const void* data, size_t bytes) {
  if (XXH3_64bits_update(s->xxh, data, bytes) != XXH_OK) __builtin_trap();
}

uint64_t Digest(const State* s) { return XXH3_64bits_digest(s->xxh); }

}  // namespace reshard::agent::xxh3_avx2

#else  // not x86-64: Available() is false, so none of these runs

namespace reshard::agent::xxh3_avx2 {
struct State {};
State* Create() { __builtin_trap(); }
void Free(State*) { __builtin_trap(); }
void Update(State*, const void*, size_t) { __builtin_trap(); }
uint64_t Digest(const State*) { __builtin_trap(); }
}  // namespace reshard::agent::xxh3_avx2

#endif
