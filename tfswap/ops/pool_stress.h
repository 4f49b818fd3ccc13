// Many threads allocating and freeing at random, for the stress entry points of
// the pool (pool_capi.cc) and the budget arena (arena_capi.cc).
//
// Each thread allocates sizes from pick_size or frees one of its own
// allocations at random.  Every allocation is stamped with a pattern unique to
// it (the whole buffer up to 4 KiB, and its last 64 bytes), checked before the
// free: two threads handed the same memory would clobber each other's stamps.
// A refused allocation is answered with a free.  At the end every thread frees
// everything it holds.  Host memory only.

#ifndef TFSWAP_OPS_POOL_STRESS_H_
#define TFSWAP_OPS_POOL_STRESS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool_core.h"

namespace tfswap {

// allocate(bytes) -> AllocResult; release(ptr, &error) -> bool;
// pick_size(rng) -> bytes (0: skip this step).  Returns false with *error on
// corruption, a failed free or a bad alignment; *allocs counts successes.
template <typename Allocate, typename Release, typename PickSize>
bool StressThreads(int n_threads, int64_t ops_per_thread, uint64_t seed, Allocate allocate,
                   Release release, PickSize pick_size, std::atomic<uint64_t>* allocs,
                   std::string* error) {
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  auto fail = [&](const std::string& msg) {
    std::lock_guard<std::mutex> lock(err_mu);
    if (!failed.exchange(true)) *error = msg;
  };
  auto worker = [&](int t) {
    std::mt19937_64 rng(seed * 1000003 + t);
    struct Held { unsigned char* p; uint64_t bytes; unsigned char stamp; };
    std::vector<Held> held;
    auto stamp_span = [](uint64_t bytes) { return std::min<uint64_t>(bytes, 4096); };
    auto check_and_free = [&](size_t k) {
      Held h = held[k];
      held[k] = held.back();
      held.pop_back();
      for (uint64_t b = 0; b < stamp_span(h.bytes); ++b) {
        if (h.p[b] != h.stamp) { fail("corruption: a live buffer was overwritten"); return; }
      }
      for (uint64_t b = h.bytes - std::min<uint64_t>(h.bytes, 64); b < h.bytes; ++b) {
        if (h.p[b] != h.stamp) { fail("corruption at the end of a live buffer"); return; }
      }
      std::string why;
      if (!release(h.p, &why)) fail(why);
    };
    for (int64_t step = 0; step < ops_per_thread && !failed.load(); ++step) {
      if (!held.empty() && (rng() % 100) >= 55) {
        check_and_free(rng() % held.size());
        continue;
      }
      const uint64_t bytes = pick_size(rng);
      if (bytes == 0) continue;
      AllocResult r = allocate(bytes);
      if (r.status == AllocStatus::kOk) {
        allocs->fetch_add(1);
        const unsigned char stamp = static_cast<unsigned char>(rng() | 1);
        auto* p = static_cast<unsigned char*>(r.ptr);
        std::memset(p, stamp, stamp_span(bytes));
        std::memset(p + bytes - std::min<uint64_t>(bytes, 64), stamp,
                    std::min<uint64_t>(bytes, 64));
        held.push_back({p, bytes, stamp});
      } else if (r.status == AllocStatus::kBadAlignment) {
        fail(r.error);
      } else if (!held.empty()) {
        check_and_free(rng() % held.size());
      }
    }
    while (!held.empty()) check_and_free(held.size() - 1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  return !failed.load();
}

// The books after a stress run: nothing in use, one counted allocation per
// successful one.  False with *error otherwise.
inline bool BalancedAfterStress(const char* what, uint64_t in_use, uint64_t counted,
                                uint64_t made, std::string* error) {
  if (in_use == 0 && counted == made) return true;
  *error = std::string("after the stress run the ") + what + " holds " +
           std::to_string(in_use) + " bytes and counted " + std::to_string(counted) +
           " allocations, threads made " + std::to_string(made);
  return false;
}

// A size that maps to a random class of cfg, or to its small pool; 0 for a
// class entirely below the small threshold.
inline uint64_t PickPoolSize(const PoolConfig& cfg, std::mt19937_64& rng) {
  const size_t k = cfg.class_bytes.size();
  const uint64_t choice = rng() % (k + 1);
  if (choice == k || k == 0) {
    return 1 + rng() % std::max<uint64_t>(
                       1, std::min<uint64_t>(cfg.small_threshold_bytes - 1, 8192));
  }
  const uint64_t hi = cfg.class_bytes[choice];
  const uint64_t lo = std::max<uint64_t>(
      choice == 0 ? cfg.small_threshold_bytes : cfg.class_bytes[choice - 1] + 1,
      cfg.small_threshold_bytes);
  return lo > hi ? 0 : lo + rng() % (hi - lo + 1);
}

}  // namespace tfswap

#endif  // TFSWAP_OPS_POOL_STRESS_H_
