// XXH3-64 streaming with AVX2, for ItemHashCursor (item_hash.h): the
// distribution's libxxhash is built for SSE2 only, and at ~12 GB/s per core
// its XXH3 is compute-bound on the executor's hot passes; AVX2 takes about
// half the CPU. Same digests as libxxhash's XXH3_64bits (XXH3's output does
// not depend on the vector width). Only call the rest when Available().
// Thread contract: a state is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace reshard::agent::xxh3_avx2 {

struct State;

/// Whether this CPU runs AVX2 (checked once; compiled without -mavx2).
bool Available();
/// A reset state; Free it.
State* Create();
void Free(State* s);
void Update(State* s, const void* data, size_t bytes);
uint64_t Digest(const State* s);

}  // namespace reshard::agent::xxh3_avx2
