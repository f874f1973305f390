// The SQL of the PTC parts that issue 13 added (migrations/0010_ptc_buckets.sql):
// bucket groups and regenerable blobs. Listed in AllStatements
// (pg_statements.cc) like every other statement.
#pragma once

#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// $2 serialized BucketGroups in hex, in Ptc.buckets order.
inline constexpr Statement kInsertPtcBuckets{
    "insert_ptc_buckets",
    "INSERT INTO ptc_buckets (job_id, idx, spec) "
    "SELECT $1, b.ord - 1, decode(b.spec, 'hex') FROM unnest($2::text[]) WITH ORDINALITY "
    "AS b(spec, ord)"};

inline constexpr Statement kSelectPtcBuckets{
    "select_ptc_buckets", "SELECT spec FROM ptc_buckets WHERE job_id = $1 ORDER BY idx"};

// $2 the Ptc.blobs positions of the regenerable blobs.
inline constexpr Statement kSetPtcBlobsRegenerable{
    "set_ptc_blobs_regenerable",
    "UPDATE ptc_blobs SET regenerable = true WHERE job_id = $1 AND idx = ANY($2::integer[])"};

inline constexpr Statement kSelectRegenerableBlobs{
    "select_regenerable_blobs",
    "SELECT idx FROM ptc_blobs WHERE job_id = $1 AND regenerable ORDER BY idx"};

}  // namespace reshard::coordinator::pg
