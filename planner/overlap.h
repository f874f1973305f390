// Which old boxes of a tensor meet which new boxes: the stage-independent
// part of planning one tensor, shared by every tensor with the same shape and
// partition rule (DP_BUCKET tensors: one per tensor, with stages). Pure;
// thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/geometry.h"
#include "planner/layout.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

class Buckets;

// A rank position inside a stage (ResolvedLayout::PositionInStage) that holds
// a box, and where it keeps it. `stage` -1: the same on every holding stage;
// otherwise only on that stage (DP_BUCKET, whose shards differ per stage).
struct Member {
  int position;
  int stage;
  View view;
  int32_t strides = -1;  // index of view.strides in the plan's table (set by MakePlan)
};
// One box of the global tensor with every member that holds it. The groups
// of one side of a template are pairwise disjoint.
struct Group {
  Box box;
  std::vector<Member> members;
};
struct Overlap {
  int old_group;
  int new_group;
  Box region;
  int32_t shape = -1;  // index of region.size in the plan's shapes (set by MakePlan)
};
// Local positions of a new member's buffer that are padding.
struct PadRun {
  int position;
  int stage;  // as in Member
  int64_t offset;
  int64_t count;
};

struct Template {
  std::vector<Group> old_groups;
  std::vector<Group> new_groups;
  std::vector<Overlap> overlaps;
  std::vector<PadRun> new_padding;
};

/// Key of the template cache: shape and the partition rule (a DP_BUCKET
/// tensor's own index: its shards depend on the other members).
std::string TemplateKey(const v1::TensorSpec& t, int tensor_index);

/// The template of tensor `tensor` of `ptc` for the transition `from` -> `to`
/// (`*_buckets` built from the same ptc and layouts).
Template BuildTemplate(const v1::Ptc& ptc, int tensor, const ResolvedLayout& from,
                       const Buckets& from_buckets, const ResolvedLayout& to,
                       const Buckets& to_buckets);

/// Cuts groups whose boxes intersect into disjoint boxes, each held by every
/// member of every group that contained it. Groups meeting no other group
/// are kept as they are.
void MakeDisjoint(std::vector<Group>* groups);

}  // namespace reshard::planner
