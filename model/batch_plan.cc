#include "model/batch_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace maskd {

std::vector<int> PlanEncoderBatches(int n, const std::vector<EncoderBatchCost>& costs) {
  if (n <= 0 || costs.empty()) return {};
  int largest = 0;
  for (const auto& c : costs) largest = std::max(largest, c.batch_size);
  if (largest < 1) return {};
  // Unbounded knapsack over "rows covered", up to n + largest - 1 (no cheapest cover pads more than
  // one largest batch). best[k]: the cheapest way to cover exactly k rows.
  struct Best {
    double cost = std::numeric_limits<double>::infinity();
    int passes = 0;
    int last = 0;  // the size added last (0: unreachable)
  };
  const int limit = n + largest - 1;
  std::vector<Best> best(static_cast<size_t>(limit) + 1);
  best[0].cost = 0;
  for (int k = 1; k <= limit; ++k) {
    for (const auto& c : costs) {
      const int s = c.batch_size;
      if (s < 1 || s > k || best[k - s].cost == std::numeric_limits<double>::infinity()) continue;
      const double cost = best[k - s].cost + (c.seconds > 0 ? c.seconds : 1.0);
      const int passes = best[k - s].passes + 1;
      // Costs are compared with a relative tolerance: measured times that differ by noise only must
      // not decide against fewer passes.
      const double eps = 1e-9 * std::max(1.0, std::abs(cost));
      Best& b = best[k];
      if (cost < b.cost - eps || (std::abs(cost - b.cost) <= eps && passes < b.passes)) b = {cost, passes, s};
    }
  }
  int pick = -1;
  for (int k = n; k <= limit; ++k) {
    if (best[k].cost == std::numeric_limits<double>::infinity()) continue;
    // Fewer padded rows wins a tie: k grows with the padding, so only a strictly cheaper cover moves on.
    if (pick < 0 || best[k].cost < best[pick].cost - 1e-9 * std::max(1.0, std::abs(best[k].cost))) pick = k;
  }
  std::vector<int> plan;
  for (int k = pick; k > 0; k -= best[k].last) plan.push_back(best[k].last);
  std::sort(plan.rbegin(), plan.rend());
  return plan;
}

bool PerImageCostFlat(const EncoderBatchCost& smaller, const EncoderBatchCost& larger) {
  if (smaller.batch_size < 1 || larger.batch_size <= smaller.batch_size || smaller.seconds <= 0 ||
      larger.seconds <= 0)
    return false;
  const double per_smaller = smaller.seconds / smaller.batch_size;
  const double per_larger = larger.seconds / larger.batch_size;
  return per_larger >= (1.0 - kFlatPerImageCost) * per_smaller;
}

bool PreferFolded(double fused_ms, double folded_ms) {
  return fused_ms > 0 && folded_ms > 0 && folded_ms < 0.97 * fused_ms;
}

void ExtrapolateFlatEncoderCosts(std::vector<EncoderBatchCost>& costs, size_t measured) {
  if (measured == 0 || measured >= costs.size()) return;
  const EncoderBatchCost& last = costs[measured - 1];
  if (last.batch_size < 1 || last.seconds <= 0) return;
  const double per_image = last.seconds / last.batch_size;
  for (size_t i = measured; i < costs.size(); ++i) {
    costs[i].seconds = per_image * costs[i].batch_size;
    costs[i].extrapolated = true;
  }
}

std::vector<std::vector<size_t>> SplitDecodePasses(const std::vector<size_t>& prompts,
                                                   const std::vector<int64_t>& image_of, size_t limit) {
  std::vector<std::vector<size_t>> passes;
  if (prompts.empty()) return passes;
  const size_t per_pass = limit > 0 ? limit : prompts.size();
  const size_t n_passes = (prompts.size() + per_pass - 1) / per_pass;
  std::vector<size_t> order = prompts;
  if (n_passes > 1 && image_of.size() == prompts.size()) {
    // Each prompt's image rank (by first appearance), then a stable sort on it.
    std::map<int64_t, size_t> rank;
    std::vector<size_t> rank_of(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) rank_of[i] = rank.emplace(image_of[i], rank.size()).first->second;
    std::vector<size_t> pos(prompts.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = i;
    std::stable_sort(pos.begin(), pos.end(), [&](size_t a, size_t b) { return rank_of[a] < rank_of[b]; });
    for (size_t i = 0; i < pos.size(); ++i) order[i] = prompts[pos[i]];
  }
  for (size_t k = 0, begin = 0; k < n_passes; ++k) {
    const size_t end = order.size() * (k + 1) / n_passes;
    passes.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(begin),
                        order.begin() + static_cast<std::ptrdiff_t>(end));
    begin = end;
  }
  return passes;
}

}  // namespace maskd
