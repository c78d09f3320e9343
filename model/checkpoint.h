// Reading and writing SAM checkpoints without executing code.
//
// The official SAM checkpoints are `torch.save(model.state_dict())`: a zip archive whose top folder
// is named after the file (older torch) or "archive" (newer), holding `data.pkl` (a pickled
// OrderedDict with a `_metadata` attribute) and one record per tensor storage. torch::pickle_load
// cannot read them ("Expected GenericDict but got None"), so this is a small pickle machine of our
// own that understands only what a tensor state dict needs — dicts/OrderedDicts, tuples, lists,
// strings, numbers, the tensor-rebuild functions and storage types — and rejects every other global
// with an error naming it. Nothing in a checkpoint is ever called.
//
// `.safetensors` files are read too (JSON header + raw little-endian data).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "model/api/status.h"

namespace maskd {

// Tensors by name, in file order. CPU tensors, contiguous.
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// Reads a torch.save zip archive (.pth/.pt) of a dict of tensors, or a .safetensors file (by content,
// not by extension). Errors name the file and the problem.
StatusOr<StateDict> ReadStateDict(const std::string& path);

// Writes `tensors` as torch.save(OrderedDict) would (zip archive, protocol-2 pickle with an empty
// `_metadata`, storages as separate records), readable by torch.load(weights_only=True) and by
// ReadStateDict.
Status WriteStateDict(const StateDict& tensors, const std::string& path);

}  // namespace maskd
