#include "core/model/logit_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lgpt {

bool LogitRowUsable(const float* values, int64_t vocab) {
  bool finite = false;
  for (int64_t v = 0; v < vocab; ++v) {
    const float x = values[v];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) return false;
    finite = finite || std::isfinite(x);
  }
  return finite;
}

std::vector<int64_t> MostLikelyIds(const float* values, int64_t vocab, int64_t k) {
  const auto more_likely = [values](int64_t a, int64_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  std::vector<int64_t> heap;
  heap.reserve(static_cast<size_t>(std::min(k, vocab)));
  for (int64_t v = 0; v < vocab; ++v) {
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(v);
      std::push_heap(heap.begin(), heap.end(), more_likely);
    } else if (more_likely(v, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), more_likely);
      heap.back() = v;
      std::push_heap(heap.begin(), heap.end(), more_likely);
    }
  }
  std::sort(heap.begin(), heap.end(), more_likely);
  return heap;
}

}  // namespace lgpt
