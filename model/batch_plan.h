// Which encoder batch sizes run a batch of n images: the cheapest cover by the prepared (captured)
// sizes, by a cost table. Torch-free so that its unit test stays small.
//
// Why not "the next size up": with graphs for 1, 2, 4 and 8, five images could run as one 8-graph
// (three rows of padding) or as 4 + 1; which is faster depends on the device and the model, so the
// engine measures each prepared size at warm-up (EngineImpl::MeasureEncoderCosts) and plans
// with those times. Without measured costs every pass costs the same, which gives the old rule (the
// fewest passes, then the least padding).
#pragma once

#include <vector>

#include "model/api/engine.h"  // EncoderBatchCost

namespace maskd {

// Batch sizes to run, largest first, whose sum is >= n (> 0) and whose total cost is the least (ties:
// the fewest padded rows, then the fewest passes). `costs` holds each prepared size once, sizes >= 1.
// Empty for n <= 0 or no sizes.
std::vector<int> PlanEncoderBatches(int n, const std::vector<EncoderBatchCost>& costs);

}  // namespace maskd
