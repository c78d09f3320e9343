// Which encoder batch sizes run a batch of n images: the cheapest cover by the prepared (captured)
// sizes, by a cost table; and how the decoder splits a large bucket of prompts into passes. Torch-free
// so that its unit test stays small.
//
// Why not "the next size up": with graphs for 1, 2, 4 and 8, five images could run as one 8-graph
// (three rows of padding) or as 4 + 1; which is faster depends on the device and the model, so the
// engine measures each prepared size at warm-up (EngineImpl::MeasureEncoderCosts) and plans
// with those times. Without measured costs every pass costs the same, which gives the old rule (the
// fewest passes, then the least padding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/api/engine.h"  // EncoderBatchCost

namespace maskd {

// Batch sizes to run, largest first, whose sum is >= n (> 0) and whose total cost is the least (ties:
// the fewest padded rows, then the fewest passes). `costs` holds each prepared size once, sizes >= 1.
// Empty for n <= 0 or no sizes.
std::vector<int> PlanEncoderBatches(int n, const std::vector<EncoderBatchCost>& costs);

// The warm-up measures the sizes in ascending order and stops once the cost per image has stopped
// falling: a size that costs per image no less than (1 - kFlatPerImageCost) of the previous size's.
// The larger sizes are then taken to cost the same per image, instead of being replayed: in run 45
// (H100) vit_h's sizes 8, 16 and 32 were 0.67 s of its 5.26 s start-up and cost 12.0, 11.9 and 12.0
// ms per image against size 4's 11.6. A plan by the extrapolated table can differ from one by the
// replayed times only between covers within those few per cent of each other.
inline constexpr double kFlatPerImageCost = 0.03;

// True when `larger` (a larger batch size, both measured) is no cheaper per image than `smaller` by
// kFlatPerImageCost or more.
bool PerImageCostFlat(const EncoderBatchCost& smaller, const EncoderBatchCost& larger);

// The global blocks' attention choice at one encoder batch size (EngineImpl::ChooseGlobalAttention):
// the folded way (cuDNN, rel-pos terms rounded to the model's 16-bit type) only where it was measured at least 3 %
// faster than the fused kernel (rel-pos terms in fp32); a folded time <= 0 means it did not run.
bool PreferFolded(double fused_ms, double folded_ms);

// Sets costs[measured..] (ascending sizes, costs[measured - 1] measured) to costs[measured - 1]'s
// per-image cost times their batch size, marked extrapolated. No-op when measured is 0 or past the end.
void ExtrapolateFlatEncoderCosts(std::vector<EncoderBatchCost>& costs, size_t measured);

// The decoder's passes over one token-count bucket (EngineImpl::DecodeEach): `prompts` (item indices,
// in the caller's order) in the fewest passes of at most `limit` prompts (0: one pass), of equal size
// to within one. image_of[i] names prompts[i]'s embedding (any value; equal values = one image); an
// image_of of another length than prompts leaves the order as given.
//
// When it takes more than one pass, the prompts are ordered by image first (stably, images in the order
// of their first prompt), so that each pass holds as few images as it can: the shared-image decoder's
// first block runs once per image of a pass (its keys, their projection and the token->image
// attention), so 256 prompts over 32 images (8 each) given image by image in turn (maskbench's jagged
// case; any one Decode of more than `limit` prompts of several images) cost 4 passes x 32 images of
// that work before, and about 32 + 3 with the grouping (run 58: 20.9k -> 24.0k prompts/s). A server's
// decoder batches are at most `limit` prompts (--decoder-max-prompts), one pass each. Within an image
// the caller's order is kept.
std::vector<std::vector<size_t>> SplitDecodePasses(const std::vector<size_t>& prompts,
                                                   const std::vector<int64_t>& image_of, size_t limit);

}  // namespace maskd
