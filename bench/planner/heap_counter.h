// Exact accounting of the C++ heap in the benchmark binary: heap_counter.cc
// replaces the global operator new/delete and sums malloc_usable_size() of
// live blocks. Link it into a binary only (never into a library). Counters
// are atomics; safe from any thread.
#pragma once

#include <cstdint>

namespace reshard::bench {

/// Bytes currently allocated through operator new (usable sizes).
int64_t HeapInUse();

/// Highest HeapInUse() since the last ResetHeapPeak().
int64_t HeapPeak();

/// Starts a new peak window at the current HeapInUse().
void ResetHeapPeak();

}  // namespace reshard::bench
