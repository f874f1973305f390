// Which old boxes of a tensor meet which new boxes: the stage-independent
// part of planning one tensor, shared by every tensor with the same shape and
// tp/dp rule. Pure; thread-compatible.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "planner/geometry.h"
#include "planner/layout.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

// Ranks of one generation that share a (tp, dp) coordinate hold the same
// shard; a Group is one box of the global tensor with every coordinate that
// holds it (data-parallel replicas) and where each keeps it.
struct Member {
  int tp_index;
  int dp_index;
  View view;
};
struct Group {
  Box box;
  std::vector<Member> members;
};
struct Overlap {
  int old_group;
  int new_group;
  Box region;
};

// The stage-independent part of planning one tensor: which old boxes meet
// which new boxes. Shared by every tensor with the same shape and tp/dp rule.
struct Template {
  std::vector<Group> old_groups;
  std::vector<Group> new_groups;
  std::vector<Overlap> overlaps;
  // Padding of each new coordinate's buffer, index tp_index + tp * dp_index.
  std::vector<std::pair<int64_t, int64_t>> new_padding;  // (offset, count)
};

/// Key of the template cache: shape and the tp/dp rule.
std::string TemplateKey(const v1::TensorSpec& t);

/// The template of `t` for the transition `from` -> `to`.
Template BuildTemplate(const v1::TensorSpec& t, const ResolvedLayout& from,
                       const ResolvedLayout& to);

}  // namespace reshard::planner
