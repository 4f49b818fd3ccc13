// The genetic search's schedule mutation (SwapAdvisor §5.2): the fast path.
//
// A port of the reference Python in tfswap/core/genetics.py
// (_mutate_schedule_reference).  Both take the random draws as arguments, so
// for the same draws they return the same schedule; tests/core/test_genetics.py
// checks it.  Read the Python for the reasoning.
//
// Plain C ABI, no Python or TensorFlow headers: loaded with ctypes.
// Build: g++ -O2 -std=c++17 -shared -fPIC -ffp-contract=off schedule_ops.cc

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

extern "C" int tfswap_mutate_schedule(int64_t n, const int64_t* schedule,
                                      const int64_t* indegree, const int64_t* succ_start,
                                      const int64_t* succ, double probability,
                                      const double* draw, const double* pick, int64_t* out) {
  std::vector<int64_t> position(n), indeg(indegree, indegree + n), slot(n, -1);
  std::vector<char> done(n, 0);
  for (int64_t p = 0; p < n; ++p) {
    int64_t op = schedule[p];
    if (op < 0 || op >= n) return 2;
    position[op] = p;
  }
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> heap;
  std::vector<int64_t> ready;
  ready.reserve(n);
  // Ready ops start in schedule order, as in the reference.
  for (int64_t p = 0; p < n; ++p) {
    int64_t op = schedule[p];
    if (indeg[op] == 0) {
      heap.push(p);
      slot[op] = static_cast<int64_t>(ready.size());
      ready.push_back(op);
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    if (ready.empty()) return 1;  // a cycle: not a DAG
    int64_t op;
    if (draw[k] < probability) {
      int64_t size = static_cast<int64_t>(ready.size());
      int64_t i = static_cast<int64_t>(pick[k] * static_cast<double>(size));
      if (i >= size) i = size - 1;
      op = ready[i];
    } else {
      while (done[schedule[heap.top()]]) heap.pop();
      op = schedule[heap.top()];
      heap.pop();
    }
    int64_t last = ready.back();
    ready.pop_back();
    if (last != op) {
      ready[slot[op]] = last;
      slot[last] = slot[op];
    }
    slot[op] = -1;
    done[op] = 1;
    out[k] = op;
    for (int64_t e = succ_start[op]; e < succ_start[op + 1]; ++e) {
      int64_t s = succ[e];
      if (--indeg[s] == 0) {
        heap.push(position[s]);
        slot[s] = static_cast<int64_t>(ready.size());
        ready.push_back(s);
      }
    }
  }
  return 0;
}
