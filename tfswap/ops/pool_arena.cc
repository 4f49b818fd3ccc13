#include "pool_arena.h"

#include <algorithm>
#include <limits>

namespace tfswap {
namespace {

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

}  // namespace

// A layout's PoolCore reserves its block through this: one free range of the
// arena.  Both calls happen with the arena's mutex held (Activate carves, and
// a layout is destroyed only under the mutex).
class BudgetArena::CarveSource : public MemorySource {
 public:
  CarveSource(BudgetArena* arena, int32_t layout) : arena_(arena), layout_(layout) {}
  void* Reserve(size_t bytes, size_t alignment, std::string* error) override {
    const uint64_t off = arena_->TakeLocked(bytes, alignment, bytes, layout_);
    if (off == kNone) {
      *error = "no free block of " + std::to_string(bytes) + " bytes";
      return nullptr;
    }
    Layout& l = arena_->layouts_[layout_];
    l.offset = off;
    l.bytes = arena_->used_[off].bytes;
    return arena_->base_ + off;
  }
  void Release(void* base) override {
    arena_->GiveLocked(static_cast<uint64_t>(static_cast<char*>(base) - arena_->base_));
  }
  bool HostAccessible() const override { return arena_->host_accessible(); }

 private:
  BudgetArena* arena_;
  int32_t layout_;
};

BudgetArena::BudgetArena(uint64_t arena_bytes, std::unique_ptr<MemorySource> source)
    : arena_bytes_(arena_bytes), source_(std::move(source)) {}

std::unique_ptr<BudgetArena> BudgetArena::Create(uint64_t arena_bytes,
                                                 std::unique_ptr<MemorySource> source,
                                                 std::string* error) {
  if (arena_bytes == 0) {
    *error = "the budget arena needs a budget > 0 bytes";
    return nullptr;
  }
  if (source == nullptr) {
    *error = "no memory source given";
    return nullptr;
  }
  std::unique_ptr<BudgetArena> arena(
      new BudgetArena(RoundUp(arena_bytes, kObjectAlignment), std::move(source)));
  arena->base_ = static_cast<char*>(
      arena->source_->Reserve(arena->arena_bytes_, kObjectAlignment, error));
  if (arena->base_ == nullptr) return nullptr;
  if (reinterpret_cast<uintptr_t>(arena->base_) % kObjectAlignment != 0) {
    *error = "the memory source returned an arena that is not aligned to " +
             std::to_string(kObjectAlignment) + " bytes";
    arena->source_->Release(arena->base_);
    arena->base_ = nullptr;
    return nullptr;
  }
  arena->free_[0] = arena->arena_bytes_;
  arena->by_size_.insert({arena->arena_bytes_, 0});
  return arena;
}

BudgetArena::~BudgetArena() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Layout& l : layouts_) l.core.reset();  // their blocks go back first
  if (base_ != nullptr) source_->Release(base_);
}

uint64_t BudgetArena::TakeLocked(uint64_t bytes, uint64_t alignment, uint64_t requested,
                                 int32_t layout) {
  const uint64_t need = RoundUp(std::max<uint64_t>(bytes, 1), kObjectAlignment);
  alignment = std::max<uint64_t>(alignment, kObjectAlignment);
  // Best fit: the smallest free range that holds the aligned block.
  for (auto it = by_size_.lower_bound({need, 0}); it != by_size_.end(); ++it) {
    const uint64_t off = it->second, len = it->first;
    const uint64_t start = RoundUp(off, alignment);
    if (start + need > off + len) continue;
    by_size_.erase(it);
    free_.erase(off);
    if (start > off) {  // the alignment gap stays free
      free_[off] = start - off;
      by_size_.insert({start - off, off});
    }
    if (start + need < off + len) {
      free_[start + need] = off + len - start - need;
      by_size_.insert({off + len - start - need, start + need});
    }
    used_[start] = Block{need, requested, layout};
    return start;
  }
  return kNone;
}

void BudgetArena::GiveLocked(uint64_t offset) {
  auto u = used_.find(offset);
  uint64_t lo = offset, hi = offset + u->second.bytes;
  used_.erase(u);
  auto next = free_.lower_bound(lo);
  if (next != free_.end() && next->first == hi) {
    hi += next->second;
    by_size_.erase({next->second, next->first});
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == lo) {
      lo = prev->first;
      by_size_.erase({prev->second, prev->first});
      free_.erase(prev);
    }
  }
  free_[lo] = hi - lo;
  by_size_.insert({hi - lo, lo});
}

uint64_t BudgetArena::LargestFreeLocked() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

std::string BudgetArena::DescribeLocked() const {
  return "the arena has " + std::to_string(arena_bytes_) + " bytes: " +
         std::to_string(general_in_use_) + " in use outside any plan (variables, inputs), " +
         std::to_string(carved_bytes_) + " carved for plans, largest free block " +
         std::to_string(LargestFreeLocked());
}

int32_t BudgetArena::AddLayout(const PoolConfig& config, std::string* error) {
  if (!PoolCore::Validate(config, error)) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  layouts_.push_back(Layout{config, false, nullptr, 0, 0});
  return static_cast<int32_t>(layouts_.size() - 1);
}

void BudgetArena::UncarveLocked(Layout& l) {
  l.core.reset();  // CarveSource::Release gives the block back
  carved_bytes_ -= l.bytes;
  l.offset = l.bytes = 0;
}

bool BudgetArena::EvictIdleLocked() {
  bool any = false;
  for (size_t i = 0; i < layouts_.size(); ++i) {
    Layout& l = layouts_[i];
    if (l.core != nullptr && static_cast<int32_t>(i) != active_ &&
        l.core->Stats().bytes_in_use == 0) {
      UncarveLocked(l);
      any = true;
    }
  }
  return any;
}

bool BudgetArena::CarveLocked(int32_t id, std::string* error) {
  Layout& l = layouts_[id];
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string why;
    auto core = PoolCore::Create(l.config, std::make_unique<CarveSource>(this, id), &why);
    if (core != nullptr) {
      l.core = std::move(core);   // CarveSource::Reserve set l.offset and l.bytes
      carved_bytes_ += l.bytes;
      return true;
    }
    if (attempt == 0 && EvictIdleLocked()) continue;
    *error = "tfswap budget arena: the pool of plan '" + l.config.plan_id +
             "' needs one free block of its size (" + why + "); " + DescribeLocked() +
             ". Re-plan with a smaller budget, or free what the process keeps on the device";
    return false;
  }
  return false;
}

bool BudgetArena::Activate(int32_t id, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<int32_t>(layouts_.size()) || layouts_[id].removed) {
    *error = "tfswap budget arena: no layout " + std::to_string(id);
    return false;
  }
  if (layouts_[id].core == nullptr && !CarveLocked(id, error)) return false;
  active_ = id;
  return true;
}

void BudgetArena::Deactivate() {
  std::lock_guard<std::mutex> lock(mu_);
  active_ = -1;
}

bool BudgetArena::RemoveLayout(int32_t id, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<int32_t>(layouts_.size()) || layouts_[id].removed) {
    *error = "tfswap budget arena: no layout " + std::to_string(id);
    return false;
  }
  Layout& l = layouts_[id];
  if (l.core != nullptr) {
    const PoolStats s = l.core->Stats();
    if (s.bytes_in_use != 0) {
      *error = "tfswap budget arena: plan '" + l.config.plan_id + "' still holds " +
               std::to_string(s.bytes_in_use) + " bytes of its pool; free its tensors first";
      return false;
    }
    UncarveLocked(l);
  }
  if (active_ == id) active_ = -1;
  l.removed = true;
  l.config = PoolConfig{};
  return true;
}

AllocResult BudgetArena::Allocate(size_t bytes, size_t alignment) {
  AllocResult r;
  if (alignment > kObjectAlignment) {
    r.status = AllocStatus::kBadAlignment;
    r.error = "tfswap budget arena: alignment " + std::to_string(alignment) +
              " requested, the arena aligns to " + std::to_string(kObjectAlignment);
    return r;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string stray;
  if (active_ >= 0) {
    r = layouts_[active_].core->Allocate(bytes, alignment);
    if (r.status == AllocStatus::kOk) {
      r.layout = active_;
      layout_in_use_ += r.class_bytes;
    } else {
      stray = r.error;
    }
  }
  if (active_ < 0 || !stray.empty()) {
    uint64_t off = TakeLocked(bytes, kObjectAlignment, bytes, -1);
    if (off == kNone && EvictIdleLocked()) off = TakeLocked(bytes, kObjectAlignment, bytes, -1);
    r = AllocResult{};
    if (off == kNone) {
      r.status = AllocStatus::kArenaFull;
      r.error = "tfswap budget arena: no free block for a request of " + std::to_string(bytes) +
                " bytes; " + DescribeLocked() +
                (stray.empty() ? "" : "; the active plan could not serve it either: " + stray);
      return r;
    }
    r.ptr = base_ + off;
    r.class_index = kGeneralClass;
    r.object_index = static_cast<int64_t>(off);
    r.class_bytes = used_[off].bytes;
    general_in_use_ += r.class_bytes;
    if (!stray.empty()) {
      strays_ += 1;
      stray_bytes_ += r.class_bytes;
      last_stray_ = stray;
    }
  }
  num_allocs_ += 1;
  largest_alloc_ = std::max<uint64_t>(largest_alloc_, bytes);
  peak_bytes_in_use_ = std::max(peak_bytes_in_use_, general_in_use_ + layout_in_use_);
  return r;
}

bool BudgetArena::Free(void* ptr, std::string* error) {
  const char* p = static_cast<const char*>(ptr);
  if (ptr == nullptr || p < base_ || p >= base_ + arena_bytes_) {
    *error = "tfswap budget arena: free of a pointer outside the arena";
    return false;
  }
  const uint64_t off = static_cast<uint64_t>(p - base_);
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(off);
  if (u != used_.end() && u->second.layout < 0) {
    general_in_use_ -= u->second.bytes;
    GiveLocked(off);
    return true;
  }
  for (Layout& l : layouts_) {
    if (l.core == nullptr || off < l.offset || off >= l.offset + l.bytes) continue;
    uint64_t requested = 0, allocated = 0;
    int32_t cls;
    int64_t obj;
    if (!l.core->Lookup(ptr, &cls, &obj, &requested, &allocated)) break;
    if (!l.core->Free(ptr, error)) return false;
    layout_in_use_ -= allocated;
    return true;
  }
  *error = "tfswap budget arena: free of a pointer that is not a live allocation "
           "(double free or foreign pointer)";
  return false;
}

bool BudgetArena::Lookup(const void* ptr, uint64_t* requested_bytes,
                         uint64_t* allocated_bytes) const {
  const char* p = static_cast<const char*>(ptr);
  if (ptr == nullptr || p < base_ || p >= base_ + arena_bytes_) return false;
  const uint64_t off = static_cast<uint64_t>(p - base_);
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(off);
  if (u != used_.end() && u->second.layout < 0) {
    *requested_bytes = u->second.requested;
    *allocated_bytes = u->second.bytes;
    return true;
  }
  for (const Layout& l : layouts_) {
    if (l.core == nullptr || off < l.offset || off >= l.offset + l.bytes) continue;
    int32_t cls;
    int64_t obj;
    return l.core->Lookup(ptr, &cls, &obj, requested_bytes, allocated_bytes);
  }
  return false;
}

ArenaStats BudgetArena::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ArenaStats s;
  s.arena_bytes = arena_bytes_;
  s.bytes_in_use = general_in_use_ + layout_in_use_;
  s.peak_bytes_in_use = peak_bytes_in_use_;
  s.general_in_use = general_in_use_;
  s.carved_bytes = carved_bytes_;
  s.largest_free_bytes = LargestFreeLocked();
  s.num_allocs = num_allocs_;
  s.strays = strays_;
  s.stray_bytes = stray_bytes_;
  s.largest_alloc_size = largest_alloc_;
  s.active_layout = active_;
  return s;
}

bool BudgetArena::LayoutStats(int32_t id, LayoutPlace* place, PoolStats* stats) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<int32_t>(layouts_.size()) || layouts_[id].removed) return false;
  const Layout& l = layouts_[id];
  place->carved = l.core != nullptr;
  place->offset = l.offset;
  place->bytes = l.bytes;
  if (l.core != nullptr) *stats = l.core->Stats();
  return true;
}

bool BudgetArena::LayoutConfig(int32_t id, PoolConfig* config) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<int32_t>(layouts_.size()) || layouts_[id].removed) return false;
  *config = layouts_[id].config;
  return true;
}

std::string BudgetArena::last_stray() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_stray_;
}

void BudgetArena::ClearPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_bytes_in_use_ = general_in_use_ + layout_in_use_;
}

bool BudgetArena::CheckConsistency(std::string* error) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> spans(free_.begin(), free_.end());
  uint64_t general = 0, carved = 0, layout_bytes = 0;
  for (const auto& [off, b] : used_) {
    spans.push_back({off, b.bytes});
    (b.layout < 0 ? general : carved) += b.bytes;
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [off, len] : spans) {
    if (off != at || len == 0) {
      *error = "free and used ranges do not tile the arena at offset " + std::to_string(at);
      return false;
    }
    at += len;
  }
  if (at != arena_bytes_ || by_size_.size() != free_.size()) {
    *error = "free and used ranges cover " + std::to_string(at) + " of " +
             std::to_string(arena_bytes_) + " bytes, or the size index disagrees";
    return false;
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      *error = "two free ranges touch at offset " + std::to_string(next->first);
      return false;
    }
  }
  for (const Layout& l : layouts_) {
    if (l.core == nullptr) continue;
    if (!l.core->CheckConsistency(error)) return false;
    layout_bytes += l.core->Stats().bytes_in_use;
  }
  if (general != general_in_use_ || carved != carved_bytes_ || layout_bytes != layout_in_use_) {
    *error = "the arena's counters disagree with its blocks (general " +
             std::to_string(general) + " vs " + std::to_string(general_in_use_) + ", carved " +
             std::to_string(carved) + " vs " + std::to_string(carved_bytes_) + ", plan " +
             std::to_string(layout_bytes) + " vs " + std::to_string(layout_in_use_) + ")";
    return false;
  }
  return true;
}

}  // namespace tfswap
