// C entry points of the budget arena (pool_arena.h) for tfswap.ops.allocator
// (ctypes).  A handle is a BudgetArena*: one over host memory from
// tfswap_arena_create (tests, replay), or the one TensorFlow's GPU device
// allocates from (tfswap_gpu_arena, pool_allocator.cc).  No TensorFlow here.
//
// Return codes: 0 ok, 1 no room (the arena, or the plan's pool on carving),
// 2 bad argument, 3 internal inconsistency found.  Messages go to err.

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "pool_arena.h"
#include "pool_capi.h"
#include "pool_stress.h"

namespace {

tfswap::BudgetArena* Arena(void* handle) { return static_cast<tfswap::BudgetArena*>(handle); }

}  // namespace

extern "C" {

int tfswap_arena_create(uint64_t arena_bytes, void** out, char* err, size_t errlen) {
  std::string error;
  auto arena = tfswap::BudgetArena::Create(arena_bytes, tfswap::NewHostMemorySource(), &error);
  if (arena == nullptr) {
    tfswap::SetError(err, errlen, error);
    return 2;
  }
  *out = arena.release();
  return 0;
}

void tfswap_arena_destroy(void* arena) { delete Arena(arena); }

// *out_id receives the layout's id.
int tfswap_arena_add_layout(void* arena, int32_t n_classes, const uint64_t* class_bytes,
                            const uint64_t* class_count, uint64_t small_pool_bytes,
                            uint64_t small_threshold_bytes, const char* plan_id,
                            const uint64_t* object_offsets, int32_t* out_id, char* err,
                            size_t errlen) {
  if (n_classes < 0) {
    tfswap::SetError(err, errlen, "n_classes must be >= 0");
    return 2;
  }
  std::string error;
  const int32_t id = Arena(arena)->AddLayout(
      tfswap::MakePoolConfig(n_classes, class_bytes, class_count, small_pool_bytes,
                             small_threshold_bytes, plan_id, object_offsets),
      &error);
  if (id < 0) {
    tfswap::SetError(err, errlen, error);
    return 2;
  }
  *out_id = id;
  return 0;
}

int tfswap_arena_activate(void* arena, int32_t id, char* err, size_t errlen) {
  std::string error;
  if (Arena(arena)->Activate(id, &error)) return 0;
  tfswap::SetError(err, errlen, error);
  return error.find("no layout") != std::string::npos ? 2 : 1;
}

void tfswap_arena_deactivate(void* arena) { Arena(arena)->Deactivate(); }

int tfswap_arena_remove_layout(void* arena, int32_t id, char* err, size_t errlen) {
  std::string error;
  if (Arena(arena)->RemoveLayout(id, &error)) return 0;
  tfswap::SetError(err, errlen, error);
  return 2;
}

// out = {offset from the arena base, layout (-1: free ranges), class
// (-2: free ranges, -1: small pool), object (or block unit / offset)}.
int tfswap_arena_allocate(void* arena, uint64_t bytes, int64_t* out, char* err, size_t errlen) {
  tfswap::BudgetArena* a = Arena(arena);
  tfswap::AllocResult r = a->Allocate(bytes, tfswap::kObjectAlignment);
  if (r.status != tfswap::AllocStatus::kOk) {
    tfswap::SetError(err, errlen, r.error);
    return 1;
  }
  out[0] = static_cast<char*>(r.ptr) - a->base();
  out[1] = r.layout;
  out[2] = r.class_index;
  out[3] = r.object_index;
  return 0;
}

int tfswap_arena_free(void* arena, uint64_t offset, char* err, size_t errlen) {
  tfswap::BudgetArena* a = Arena(arena);
  std::string error;
  if (a->Free(a->base() + offset, &error)) return 0;
  tfswap::SetError(err, errlen, error);
  return 2;
}

// out = {arena_bytes, bytes_in_use, peak_bytes_in_use, general_in_use,
// carved_bytes, largest_free_bytes, num_allocs, strays, stray_bytes,
// largest_alloc_size, active_layout (as int64)}; err gets the last stray's
// reason.
void tfswap_arena_stats(void* arena, int64_t* out, char* err, size_t errlen) {
  const tfswap::ArenaStats s = Arena(arena)->Stats();
  const uint64_t v[] = {s.arena_bytes,  s.bytes_in_use, s.peak_bytes_in_use,
                        s.general_in_use, s.carved_bytes, s.largest_free_bytes,
                        s.num_allocs,   s.strays,       s.stray_bytes,
                        s.largest_alloc_size};
  for (int i = 0; i < 10; ++i) out[i] = static_cast<int64_t>(v[i]);
  out[10] = s.active_layout;
  tfswap::SetError(err, errlen, Arena(arena)->last_stray());
}

// place = {carved, offset, bytes}; the pool arrays as tfswap_pool_stats
// (PackPoolStats) when carved.  Returns the number of classes, -1 for an
// unknown layout, or -2 - n when per_class holds fewer than its n classes.
int32_t tfswap_arena_layout_stats(void* arena, int32_t id, uint64_t* place, uint64_t* totals,
                                  uint64_t* per_class, int32_t capacity, uint64_t* small) {
  tfswap::LayoutPlace where;
  tfswap::PoolStats stats;
  if (!Arena(arena)->LayoutStats(id, &where, &stats)) return -1;
  place[0] = where.carved;
  place[1] = where.offset;
  place[2] = where.bytes;
  if (!where.carved) return 0;
  const int32_t n = static_cast<int32_t>(stats.classes.size());
  if (n > capacity) return -2 - n;
  return tfswap::PackPoolStats(stats, totals, per_class, small);
}

void tfswap_arena_clear_peak(void* arena) { Arena(arena)->ClearPeak(); }

int tfswap_arena_check(void* arena, char* err, size_t errlen) {
  std::string error;
  if (Arena(arena)->CheckConsistency(&error)) return 0;
  tfswap::SetError(err, errlen, error);
  return 3;
}

// n_threads threads allocate and free at random (pool_stress.h) sizes that map
// to layout `layout`'s classes and small pool, while one more thread activates
// and deactivates that layout at random: requests land in the plan's pool, in
// the free ranges, or stray, concurrently with the switches, as TF's executor
// threads allocate while the Python thread binds a step.  The arena must hold
// nothing when it starts and be empty and consistent at the end.
int tfswap_arena_stress(void* arena, int32_t layout, int32_t n_threads, int64_t ops_per_thread,
                        uint64_t seed, uint64_t* successful_allocs, char* err, size_t errlen) {
  tfswap::BudgetArena* a = Arena(arena);
  tfswap::LayoutPlace place;
  tfswap::PoolStats unused;
  if (!a->host_accessible() || n_threads <= 0 || ops_per_thread < 0 ||
      !a->LayoutStats(layout, &place, &unused)) {
    tfswap::SetError(err, errlen, "stress needs a host arena, a layout of it, n_threads > 0 "
                                  "and ops_per_thread >= 0");
    return 2;
  }
  const tfswap::ArenaStats before = a->Stats();
  if (before.bytes_in_use != 0) {
    tfswap::SetError(err, errlen, "stress needs an arena that holds nothing");
    return 2;
  }
  tfswap::PoolConfig cfg;
  std::string error;
  if (!a->LayoutConfig(layout, &cfg)) {
    tfswap::SetError(err, errlen, "no layout " + std::to_string(layout));
    return 2;
  }
  std::atomic<bool> done{false};
  std::atomic<bool> switch_failed{false};
  std::string switch_error;
  std::thread switcher([&] {
    std::mt19937_64 rng(seed ^ 0x5eed);
    while (!done.load()) {
      if (rng() % 2) {
        std::string why;
        if (!a->Activate(layout, &why) && why.find("no free block") == std::string::npos &&
            why.find("needs one free block") == std::string::npos) {
          switch_error = why;
          switch_failed.store(true);
          return;
        }
      } else {
        a->Deactivate();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
    }
  });
  std::atomic<uint64_t> allocs{0};
  const bool ok = tfswap::StressThreads(
      n_threads, ops_per_thread, seed,
      [a](uint64_t bytes) { return a->Allocate(bytes, 64); },
      [a](void* p, std::string* why) { return a->Free(p, why); },
      [&cfg](std::mt19937_64& rng) { return tfswap::PickPoolSize(cfg, rng); }, &allocs,
      &error);
  done.store(true);
  switcher.join();
  a->Deactivate();
  *successful_allocs = allocs.load();
  if (!ok || switch_failed.load()) {
    tfswap::SetError(err, errlen, ok ? switch_error : error);
    return 3;
  }
  if (!a->CheckConsistency(&error)) {
    tfswap::SetError(err, errlen, error);
    return 3;
  }
  const tfswap::ArenaStats s = a->Stats();
  if (!tfswap::BalancedAfterStress("arena", s.bytes_in_use, s.num_allocs - before.num_allocs,
                                   allocs.load(), &error)) {
    tfswap::SetError(err, errlen, error);
    return 3;
  }
  return 0;
}

}  // extern "C"
