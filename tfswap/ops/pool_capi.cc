// C entry points of the pool over host memory, for tfswap.ops.allocator
// (ctypes) and the AddressSanitizer driver.  No TensorFlow here, so this file
// and pool_core.cc build on their own.
//
// Return codes: 0 ok, 1 pool exhausted (a class or the small pool), 2 bad
// argument or bad event, 3 internal inconsistency found.  Messages go to err.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>

#include "pool_capi.h"
#include "pool_core.h"
#include "pool_stress.h"

namespace tfswap {

void SetError(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) return;
  const size_t n = std::min(errlen - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

int32_t PackPoolStats(const tfswap::PoolStats& s, uint64_t* totals, uint64_t* per_class,
                      uint64_t* small) {
  totals[0] = s.bytes_limit;
  totals[1] = s.bytes_in_use;
  totals[2] = s.peak_bytes_in_use;
  totals[3] = s.num_allocs;
  totals[4] = s.largest_alloc_size;
  for (size_t i = 0; i < s.classes.size(); ++i) {
    const tfswap::ClassStats& c = s.classes[i];
    uint64_t* row = per_class + 5 * i;
    row[0] = c.class_bytes;
    row[1] = c.count;
    row[2] = c.in_use;
    row[3] = c.peak_in_use;
    row[4] = c.num_allocs;
  }
  small[0] = s.small.limit_bytes;
  small[1] = s.small.in_use_bytes;
  small[2] = s.small.peak_in_use_bytes;
  small[3] = s.small.requested_in_use_bytes;
  small[4] = s.small.carved_bytes;
  small[5] = s.small.num_allocs;
  return static_cast<int32_t>(s.classes.size());
}

}  // namespace tfswap

namespace {

using tfswap::SetError;
using tfswap::PackPoolStats;

int CodeOf(tfswap::AllocStatus s) {
  switch (s) {
    case tfswap::AllocStatus::kOk: return 0;
    case tfswap::AllocStatus::kClassExhausted:
    case tfswap::AllocStatus::kSmallPoolFull:
    case tfswap::AllocStatus::kTooLarge:
    case tfswap::AllocStatus::kMemoryInUse: return 1;
    default: return 2;
  }
}

}  // namespace

extern "C" {

int tfswap_pool_create(int32_t n_classes, const uint64_t* class_bytes,
                       const uint64_t* class_count, uint64_t small_pool_bytes,
                       uint64_t small_threshold_bytes, const char* plan_id,
                       const uint64_t* object_offsets, void** out, char* err, size_t errlen) {
  if (n_classes < 0 || out == nullptr) {
    SetError(err, errlen, "bad arguments to tfswap_pool_create");
    return 2;
  }
  tfswap::PoolConfig cfg =
      tfswap::MakePoolConfig(n_classes, class_bytes, class_count, small_pool_bytes,
                             small_threshold_bytes, plan_id, object_offsets);
  std::string error;
  auto pool = tfswap::PoolCore::Create(cfg, tfswap::NewHostMemorySource(), &error);
  if (pool == nullptr) {
    SetError(err, errlen, error);
    return 2;
  }
  *out = pool.release();
  return 0;
}

void tfswap_pool_destroy(void* pool) { delete static_cast<tfswap::PoolCore*>(pool); }

// Replays events in order.  Event i allocates nbytes[i] under handle[i] when
// is_alloc[i] != 0, else frees what handle[i] holds.  For each allocation
// out_class[i] / out_object[i] receive the slot (class -1 = small pool, object
// = block offset in 256-byte units); for frees they are left alone.  On a
// failure *failed_at is the event's index, fail_info = {class index (or -1),
// class bytes, requested bytes}; the pool keeps what was allocated before it.
int tfswap_pool_replay(void* pool_ptr, int64_t n_events, const uint8_t* is_alloc,
                       const int64_t* handle, const uint64_t* nbytes, int32_t* out_class,
                       int64_t* out_object, int64_t* failed_at, int64_t* fail_info,
                       char* err, size_t errlen) {
  auto* pool = static_cast<tfswap::PoolCore*>(pool_ptr);
  std::unordered_map<int64_t, void*> live;
  live.reserve(static_cast<size_t>(n_events));
  *failed_at = -1;
  for (int64_t i = 0; i < n_events; ++i) {
    if (is_alloc[i]) {
      if (live.count(handle[i])) {
        *failed_at = i;
        SetError(err, errlen, "event " + std::to_string(i) + ": handle " +
                                  std::to_string(handle[i]) +
                                  " is allocated again before it was freed");
        return 2;
      }
      tfswap::AllocResult r = pool->Allocate(nbytes[i], 64);
      if (r.status != tfswap::AllocStatus::kOk) {
        *failed_at = i;
        fail_info[0] = r.class_index;
        fail_info[1] = static_cast<int64_t>(r.class_bytes);
        fail_info[2] = static_cast<int64_t>(nbytes[i]);
        SetError(err, errlen, r.error);
        return CodeOf(r.status);
      }
      live.emplace(handle[i], r.ptr);
      out_class[i] = r.class_index;
      out_object[i] = r.object_index;
    } else {
      auto it = live.find(handle[i]);
      if (it == live.end()) {
        *failed_at = i;
        SetError(err, errlen, "event " + std::to_string(i) + ": handle " +
                                  std::to_string(handle[i]) +
                                  " is freed but holds no allocation");
        return 2;
      }
      std::string error;
      if (!pool->Free(it->second, &error)) {
        *failed_at = i;
        SetError(err, errlen, error);
        return 3;
      }
      live.erase(it);
    }
  }
  return 0;
}

// Layout of the arrays: PackPoolStats (pool_capi.h).
int32_t tfswap_pool_stats(void* pool_ptr, uint64_t* totals, uint64_t* per_class,
                          uint64_t* small) {
  return PackPoolStats(static_cast<tfswap::PoolCore*>(pool_ptr)->Stats(), totals, per_class,
                       small);
}

int tfswap_pool_check(void* pool_ptr, char* err, size_t errlen) {
  std::string error;
  if (!static_cast<tfswap::PoolCore*>(pool_ptr)->CheckConsistency(&error)) {
    SetError(err, errlen, error);
    return 3;
  }
  return 0;
}

// n_threads threads each run ops_per_thread random steps on the pool:
// allocate a random size (one that maps to a random class, or a small one) or
// free one of their own allocations.  Each allocation is stamped with a
// pattern unique to it (whole buffer up to 4 KiB, and its last bytes), checked
// before the free: two threads handed the same memory would clobber each
// other's stamps.  Exhaustion is expected under contention and answered with a
// free.  At the end every thread frees everything and the pool must be back
// to empty and consistent.  *successful_allocs receives the number of
// successful allocations, which must equal the growth of the pool's num_allocs.
// The pool must hold nothing when the run starts.
int tfswap_pool_stress(void* pool_ptr, int32_t n_threads, int64_t ops_per_thread,
                       uint64_t seed, uint64_t* successful_allocs, char* err,
                       size_t errlen) {
  auto* pool = static_cast<tfswap::PoolCore*>(pool_ptr);
  if (!pool->host_accessible() || n_threads <= 0 || ops_per_thread < 0) {
    SetError(err, errlen, "stress needs a host pool, n_threads > 0, ops_per_thread >= 0");
    return 2;
  }
  const tfswap::PoolStats before = pool->Stats();
  if (before.bytes_in_use != 0) {
    SetError(err, errlen, "stress needs a pool that holds nothing");
    return 2;
  }
  const tfswap::PoolConfig& cfg = pool->config();
  std::atomic<uint64_t> allocs{0};
  std::string first_error;
  const bool ok = tfswap::StressThreads(
      n_threads, ops_per_thread, seed,
      [pool](uint64_t bytes) { return pool->Allocate(bytes, 64); },
      [pool](void* p, std::string* why) { return pool->Free(p, why); },
      [&cfg](std::mt19937_64& rng) { return tfswap::PickPoolSize(cfg, rng); }, &allocs,
      &first_error);
  *successful_allocs = allocs.load();
  if (!ok) {
    SetError(err, errlen, first_error);
    return 3;
  }
  std::string error;
  if (!pool->CheckConsistency(&error)) {
    SetError(err, errlen, error);
    return 3;
  }
  const tfswap::PoolStats s = pool->Stats();
  if (!tfswap::BalancedAfterStress("pool", s.bytes_in_use, s.num_allocs - before.num_allocs,
                                   allocs.load(), &error)) {
    SetError(err, errlen, error);
    return 3;
  }
  return 0;
}

}  // extern "C"
