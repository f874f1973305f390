// The verifier's reading of how a tensor is cut (docs/partitioning.md: held
// shape, expert slabs, tensor-parallel units, data-parallel shards, buckets):
// input validation and each rank's buffer as element ids. Internal to
// verifier/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "reshard/v1/ptc.pb.h"
#include "verifier/grid.h"
#include "verifier/model.h"

namespace reshard::verifier {

/// Saturation point of the verifier's size arithmetic; larger sizes are invalid.
inline constexpr int64_t kCap = int64_t{1} << 50;

/// Bytes per element of `dtype`, 0 when unknown.
int DTypeBytes(int dtype);

/// Validates the tensors and bucket groups of `ptc` where no layout is
/// involved (InvalidArgument naming the tensor, field and value).
absl::Status CheckPtcTensors(const v1::Ptc& ptc);

/// Validates the rules that depend on a layout (a block with fewer units
/// than tensor-parallel ranks must divide them). `what` names the layout.
absl::Status CheckTensorInGrid(const v1::TensorSpec& t, const RankGrid& g, const std::string& what);

/// An upper bound of rank `r`'s buffer length of tensor `t` (saturating),
/// computed without materialising anything.
int64_t BufferLengthBound(const v1::TensorSpec& t, const RankGrid& g, int r);

/// Rank `r`'s buffer of tensor `ptc.tensors(index)`: the element id (row-major
/// index into the logical shape) at each position, kPadding for padding;
/// empty when its stage does not hold the tensor. Inputs must be validated.
std::vector<int64_t> TensorBuffer(const v1::Ptc& ptc, int index, const RankGrid& g, int r);

/// Whether rank `r`'s buffer must hold an element (allow_empty unset, not a
/// bucket member, its stage holds the tensor).
bool MustHoldSomething(const v1::TensorSpec& t, const RankGrid& g, int r);

}  // namespace reshard::verifier
