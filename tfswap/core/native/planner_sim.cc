// Swap planner (SwapAdvisor §4.2) and three-stream simulator: the fast path.
//
// This is a line-by-line port of the reference Python in tfswap/core/planner.py
// (_Scan, build_program), tfswap/core/program.py (canonical) and
// tfswap/core/simulator.py (_simulate), without the event recording.  The two
// must agree exactly (same records, same floating-point operations in the same
// order); tests/core/test_native.py checks it on random graphs.  Read the
// Python for the reasoning; comments here only note where C++ differs.
//
// Plain C ABI, no Python or TensorFlow headers: loaded with ctypes.
// Build: g++ -O2 -std=c++17 -shared -fPIC -ffp-contract=off planner_sim.cc

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <climits>
#include <limits>
#include <unordered_map>
#include <vector>

namespace {

struct OutRec { int buf, after; bool copy; };
// A resident buffer's eviction key at the time it was pushed; stale once the
// buffer's version moves on.  The rule is the largest (not recent, next use,
// -last use, -buffer) among the class's residents; a heap ordered by (next
// use, -last use, -buffer) gives the same choice: the first entry in heap
// order that is not recent, or else the first eligible entry.  The reference
// uses the same heaps (_Scan._choose); tests/core/test_planner.py checks them
// against a scan of every candidate.
struct Entry { long nu; int lu, b, ver; };
struct EntryLess {
  bool operator()(const Entry& a, const Entry& b) const {
    if (a.nu != b.nu) return a.nu < b.nu;
    if (a.lu != b.lu) return a.lu > b.lu;
    return a.b > b.b;
  }
};
struct InRec { int buf, trigger, wait, own, need; };

struct Graph {
  int n_ops, n_bufs;
  const double* op_time;
  const int64_t* buf_bytes;
  const int8_t *persistent, *pinned, *modified, *kept;
  const int32_t *in_ptr, *in, *out_ptr, *out;
  const int8_t* in_write;
};

struct Scan {
  const Graph& g;
  const int32_t* order;
  const int32_t* cls;
  int n, n_classes;
  long never;
  double h2d, d2h, margin, latency;
  std::vector<double> istart, iend;
  std::vector<int> use_ptr, uses, last;
  std::vector<int64_t> counts, offset;
  // per-pass state
  std::vector<char> resident, dirty, touched, initial;
  std::vector<int> obj, last_use, cursor, pending_out, last_out, stamp, ver;
  std::vector<std::vector<Entry>> heap, fresh;
  std::vector<Entry> popped;
  std::vector<int> qbuf, qhead, qlen, rel;
  std::vector<int> removed;
  std::vector<OutRec> outs;
  std::vector<InRec> ins;
  std::vector<std::pair<int, int>> op_waits;
  bool removable = false;
  bool infeasible = false;

  Scan(const Graph& g_, const int32_t* order_, const int32_t* cls_, int n_classes_,
       const int64_t* counts_, double h2d_, double d2h_, double margin_, double latency_)
      : g(g_), order(order_), cls(cls_), n(g_.n_ops), n_classes(n_classes_),
        never(2L * g_.n_ops + 2), h2d(h2d_), d2h(d2h_), margin(margin_), latency(latency_) {
    istart.resize(n);
    iend.resize(n);
    double t = 0.0;
    for (int k = 0; k < n; ++k) {
      istart[k] = t;
      t = t + g.op_time[order[k]];
      iend[k] = t;
    }
    const int B = g.n_bufs;
    use_ptr.assign(B + 1, 0);
    for (int k = 0; k < n; ++k) {
      int o = order[k];
      for (int i = g.in_ptr[o]; i < g.in_ptr[o + 1]; ++i) use_ptr[g.in[i] + 1]++;
      for (int i = g.out_ptr[o]; i < g.out_ptr[o + 1]; ++i) use_ptr[g.out[i] + 1]++;
    }
    for (int b = 0; b < B; ++b) use_ptr[b + 1] += use_ptr[b];
    uses.assign(use_ptr[B], 0);
    std::vector<int> fill(use_ptr.begin(), use_ptr.end() - 1);
    for (int k = 0; k < n; ++k) {
      int o = order[k];
      for (int i = g.in_ptr[o]; i < g.in_ptr[o + 1]; ++i) uses[fill[g.in[i]]++] = k;
      for (int i = g.out_ptr[o]; i < g.out_ptr[o + 1]; ++i) uses[fill[g.out[i]]++] = k;
    }
    last.assign(B, -1);
    for (int b = 0; b < B; ++b)
      if (use_ptr[b + 1] > use_ptr[b]) last[b] = uses[use_ptr[b + 1] - 1];
    counts.assign(counts_, counts_ + n_classes);
    offset.assign(n_classes + 1, 0);
    for (int c = 0; c < n_classes; ++c) offset[c + 1] = offset[c] + counts[c];
  }

  // FIFO of free objects per class: a ring of counts[c] slots at offset[c].
  bool q_empty(int c) const { return qlen[c] == 0; }
  int q_pop(int c) {
    int x = qbuf[offset[c] + qhead[c]];
    qhead[c] = (qhead[c] + 1) % counts[c];
    qlen[c]--;
    return x;
  }
  void q_push(int c, int x) {
    qbuf[offset[c] + (qhead[c] + qlen[c]) % counts[c]] = x;
    qlen[c]++;
  }

  long next_use(int b) const {
    int i = use_ptr[b] + cursor[b];
    return i < use_ptr[b + 1] ? uses[i] : never;
  }

  void push(int b) {
    if (g.pinned[b]) return;
    auto& h = heap[cls[b]];
    h.push_back({next_use(b), last_use[b], b, ver[b]});
    std::push_heap(h.begin(), h.end(), EntryLess());
  }
  // No heap entry here: a buffer placed for op k is used by it, and use()
  // pushes its new key (initial residents are pushed by run()).
  void place(int b, int o) {
    resident[b] = 1;
    obj[b] = o;
    ver[b]++;
  }
  void release(int b) {
    resident[b] = 0;
    ver[b]++;
  }
  void use(int b, int k, bool writes) {
    last_use[b] = k;
    cursor[b]++;
    touched[b] = 1;
    if (writes) dirty[b] = 1;
    ver[b]++;
    if (g.persistent[b] || g.kept[b] || last[b] != k) push(b);  // else freed right after
  }
  bool valid(const Entry& e) const { return resident[e.b] && ver[e.b] == e.ver; }

  // Returns false if infeasible.  Outputs: object, out record (-1), trigger.
  bool evict(int c, int k, int incoming, bool swap_in, int* o_obj, int* o_rec, int* o_trig) {
    if (removable) {
      // Initially resident, not yet used: their entries are pushed once, at
      // the start, and go stale when used or released.
      auto& f = fresh[c];
      int e = -1;
      while (!f.empty()) {
        Entry top = f.front();
        std::pop_heap(f.begin(), f.end(), EntryLess());
        f.pop_back();
        if (!valid(top) || stamp[top.b] == k) continue;  // stamped ones are used now
        e = top.b;
        break;
      }
      if (e >= 0) {
        release(e);
        removed.push_back(e);
        *o_obj = obj[e]; *o_rec = -1; *o_trig = -1;
        return true;
      }
    }
    double in_t = swap_in ? latency + (double)g.buf_bytes[incoming] / h2d : 0.0;
    double limit = istart[k] + margin;
    int best = -1, fallback = -1;
    auto& h = heap[c];
    popped.clear();
    while (!h.empty()) {
      Entry top = h.front();
      std::pop_heap(h.begin(), h.end(), EntryLess());
      h.pop_back();
      if (!valid(top)) continue;
      popped.push_back(top);
      int b = top.b;
      if (stamp[b] == k) continue;
      if (fallback < 0) fallback = b;
      bool copy = (!g.persistent[b]) || dirty[b];
      double out_t = copy ? latency + (double)g.buf_bytes[b] / d2h : 0.0;
      bool recent = iend[last_use[b]] + out_t + in_t > limit;
      if (!recent) { best = b; break; }
    }
    for (const Entry& x : popped) {
      h.push_back(x);
      std::push_heap(h.begin(), h.end(), EntryLess());
    }
    if (best < 0) best = fallback;
    if (best < 0) return false;
    int e = best;
    release(e);
    int q = last_use[e];
    last_out[e] = (int)outs.size();
    if (g.persistent[e] && !dirty[e]) {
      outs.push_back({e, q, false});
      pending_out[e] = -1;
    } else {
      outs.push_back({e, q, true});
      pending_out[e] = next_use(e) < never ? (int)outs.size() - 1 : -1;
      dirty[e] = 0;
    }
    *o_obj = obj[e]; *o_rec = (int)outs.size() - 1; *o_trig = q;
    return true;
  }

  bool alloc(int b, int k, bool swap_in) {
    int c = cls[b];
    int o, j = -1, trigger;
    if (!q_empty(c)) {
      o = q_pop(c);
      trigger = rel[o];
    } else {
      if (!evict(c, k, b, swap_in, &o, &j, &trigger)) return false;
      if (!swap_in && j >= 0) op_waits.push_back({k, j});
    }
    if (swap_in) {
      int own = pending_out[b];
      int prev = last_out[b];
      if (prev >= 0) trigger = std::max(trigger, outs[prev].after);
      ins.push_back({b, trigger, j, own, k});
      pending_out[b] = -1;
      dirty[b] = 0;
    }
    place(b, o);
    return true;
  }

  // One pass; fills end_set (sorted).  Returns false if infeasible.
  bool run(const std::vector<int>& start_set, bool removable_, std::vector<int>& end_set) {
    const int B = g.n_bufs;
    resident.assign(B, 0); dirty.assign(B, 0); touched.assign(B, 0); initial.assign(B, 0);
    obj.assign(B, -1); last_use.assign(B, -1); cursor.assign(B, 0);
    pending_out.assign(B, -1); last_out.assign(B, -1); stamp.assign(B, -1); ver.assign(B, 0);
    removed.clear(); outs.clear(); ins.clear(); op_waits.clear();
    heap.resize(n_classes);
    fresh.resize(n_classes);
    for (int c = 0; c < n_classes; ++c) { heap[c].clear(); fresh[c].clear(); }
    qbuf.assign(offset[n_classes], 0);
    qhead.assign(n_classes, 0);
    qlen.assign(n_classes, 0);
    for (int c = 0; c < n_classes; ++c)
      for (int64_t x = offset[c]; x < offset[c + 1]; ++x) q_push(c, (int)x);
    rel.assign(offset[n_classes], -1);
    for (int b : start_set) {
      int c = cls[b];
      if (q_empty(c)) return false;
      place(b, q_pop(c));
      push(b);
      initial[b] = 1;
      dirty[b] = g.modified[b] ? 1 : 0;
      if (!g.pinned[b]) {
        fresh[c].push_back({next_use(b), -1, b, ver[b]});
        std::push_heap(fresh[c].begin(), fresh[c].end(), EntryLess());
      }
    }
    removable = removable_;
    for (int k = 0; k < n; ++k) {
      int o = order[k];
      int a0 = g.in_ptr[o], a1 = g.in_ptr[o + 1], z0 = g.out_ptr[o], z1 = g.out_ptr[o + 1];
      for (int i = a0; i < a1; ++i) stamp[g.in[i]] = k;
      for (int i = z0; i < z1; ++i) stamp[g.out[i]] = k;
      for (int i = a0; i < a1; ++i)
        if (!resident[g.in[i]] && !alloc(g.in[i], k, true)) return false;
      for (int i = z0; i < z1; ++i)
        if (!alloc(g.out[i], k, false)) return false;
      for (int i = a0; i < a1; ++i) use(g.in[i], k, g.in_write[i] != 0);
      for (int i = z0; i < z1; ++i) use(g.out[i], k, false);
      for (int pass = 0; pass < 2; ++pass) {
        int lo = pass ? z0 : a0, hi = pass ? z1 : a1;
        const int32_t* arr = pass ? g.out : g.in;
        for (int i = lo; i < hi; ++i) {
          int b = arr[i];
          if (!g.persistent[b] && !g.kept[b] && last[b] == k) {
            release(b);
            q_push(cls[b], obj[b]);
            rel[obj[b]] = k;
          }
        }
      }
    }
    end_set.clear();
    for (int b = 0; b < B; ++b)
      if (g.persistent[b] && resident[b]) end_set.push_back(b);
    return true;
  }
};

struct Program {
  std::vector<int> resident;
  std::vector<OutRec> outs;
  std::vector<InRec> ins;
  std::vector<std::pair<int, int>> op_waits;
  // A program given whole (tfswap_simulate_program) rather than planned here:
  // each swap-in's waits in CSR form (empty: InRec::wait alone), and the
  // recomputations in program order (by need; one read by another first), each running rec_ops[rec_ptr[i]..].
  std::vector<int> in_wait_ptr, in_waits;
  std::vector<int> rec_buf, rec_need, rec_ptr, rec_ops;
  // Per recomputation, (buffer, its fresh copy) pairs from rec_fresh[2 * rec_fresh_ptr[i]]:
  // a buffer the step still holds that the chain makes again in the copy instead.
  std::vector<int> rec_fresh_ptr, rec_fresh;
  // Per position, the checkpoints released when its op ends (empty: none): a
  // value a recomputation before it reads after the step's last reader.
  std::vector<std::vector<int>> held_for;
};

// canonical(): stream order and renumbering, as in program.py.
void canonical(const std::vector<int>& resident, const std::vector<OutRec>& outs,
               const std::vector<InRec>& ins, const std::vector<std::pair<int, int>>& waits,
               Program* p) {
  std::vector<int> perm(outs.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = (int)i;
  std::sort(perm.begin(), perm.end(), [&](int a, int b) {
    if (outs[a].after != outs[b].after) return outs[a].after < outs[b].after;
    return outs[a].buf < outs[b].buf;
  });
  std::vector<int> new_of(outs.size());
  p->outs.resize(outs.size());
  for (size_t i = 0; i < perm.size(); ++i) { new_of[perm[i]] = (int)i; p->outs[i] = outs[perm[i]]; }
  p->ins = ins;
  for (auto& r : p->ins) {
    if (r.wait >= 0) r.wait = new_of[r.wait];
    if (r.own >= 0) r.own = new_of[r.own];
  }
  std::sort(p->ins.begin(), p->ins.end(), [](const InRec& a, const InRec& b) {
    if (a.need != b.need) return a.need < b.need;
    return a.buf < b.buf;
  });
  p->op_waits = waits;
  for (auto& w : p->op_waits) w.second = new_of[w.second];
  std::sort(p->op_waits.begin(), p->op_waits.end());
  p->resident = resident;
  std::sort(p->resident.begin(), p->resident.end());
}

struct SimOut {
  double step = 0, stall = 0;
  int64_t peak = 0, h2d_bytes = 0, d2h_bytes = 0;
  int status = 0;  // 0 ok, 2 memory over the pool, 3 deadlock, 4 copy/read of a buffer
                   // in the wrong place (the reference's other PlanErrors)
};

// One pool object taken or given back, as the reference's AllocationEvent.
struct AllocEvent { double t; int take, buf, cls, obj; };

SimOut simulate(const Graph& g, const int32_t* order, const int32_t* cls, int n_classes,
                const int64_t* counts, const int64_t* class_bytes, int64_t small_pool,
                const Program& p, const std::vector<int>& last, double h2d_bw, double d2h_bw,
                double duplex, double latency, bool serial, int64_t* class_peak,
                std::vector<AllocEvent>* events = nullptr) {
  SimOut r;
  const int n = g.n_ops;
  const double INF = std::numeric_limits<double>::infinity();
  std::vector<int64_t> free_n(counts, counts + n_classes), in_use(n_classes, 0);
  for (int c = 0; c < n_classes; ++c) class_peak[c] = 0;
  int64_t used = 0, peak = 0;
  bool over = false;
  // Where each buffer is: 0 not on the device, 1 object taken (copy in
  // flight), 2 on the device (the reference's `arrived`).
  std::vector<char> where(g.n_bufs, 0);
  // With events: which object each buffer holds, from LIFO stacks of free
  // objects filled so that object 0 is taken first (the reference's).
  double now = 0.0;
  std::vector<std::vector<int>> stack;
  std::vector<int> obj;
  if (events) {
    stack.resize(n_classes);
    for (int c = 0; c < n_classes; ++c)
      for (int64_t j = counts[c] - 1; j >= 0; --j) stack[c].push_back((int)j);
    obj.assign(g.n_bufs, -1);
  }
  auto take = [&](int b) {
    where[b] = 1;
    int c = cls[b];
    if (free_n[c] == 0) { over = true; return; }
    free_n[c]--;
    in_use[c]++;
    class_peak[c] = std::max(class_peak[c], in_use[c]);
    used += class_bytes[c];
    peak = std::max(peak, used);
    if (events) {
      obj[b] = stack[c].back();
      stack[c].pop_back();
      events->push_back({now, 1, b, c, obj[b]});
    }
  };
  auto give = [&](int b) {
    where[b] = 0;
    int c = cls[b];
    free_n[c]++;
    in_use[c]--;
    used -= class_bytes[c];
    if (events) {
      stack[c].push_back(obj[b]);
      events->push_back({now, 0, b, c, obj[b]});
    }
  };
  // need_of: ins are sorted by need; waits sorted by position; drops by out_after.
  std::vector<int> need_ptr(n + 1, 0), wait_ptr(n + 1, 0);
  for (auto& x : p.ins) need_ptr[x.need + 1]++;
  for (auto& w : p.op_waits) wait_ptr[w.first + 1]++;
  for (int k = 0; k < n; ++k) { need_ptr[k + 1] += need_ptr[k]; wait_ptr[k + 1] += wait_ptr[k]; }
  std::vector<int> drop_ptr(n + 1, 0), drops, d2h_list;
  for (auto& o : p.outs) if (!o.copy) drop_ptr[o.after + 1]++;
  for (int k = 0; k < n; ++k) drop_ptr[k + 1] += drop_ptr[k];
  drops.resize(drop_ptr[n]);
  {
    std::vector<int> f(drop_ptr.begin(), drop_ptr.end() - 1);
    for (size_t j = 0; j < p.outs.size(); ++j)
      if (!p.outs[j].copy) drops[f[p.outs[j].after]++] = (int)j; else d2h_list.push_back((int)j);
  }
  // Recomputations by position (the planner's own programs have none: no table).
  const bool recomputes = !p.rec_need.empty();
  std::vector<int> rec_at(recomputes ? n + 1 : 0, 0), made;
  // What the recomputations before the current op ran: op ids, and the
  // outputs each made (ran_out[ran_ptr[e]..ran_ptr[e + 1]]).
  std::vector<int> ran_op, ran_ptr, ran_out, named, alias;
  if (recomputes) {
    for (int b : p.rec_need) rec_at[b + 1]++;
    for (int k = 0; k < n; ++k) rec_at[k + 1] += rec_at[k];
  }
  std::vector<std::vector<int>> temps(p.rec_need.empty() ? 0 : n);
  double recompute_s = 0.0;
  std::vector<char> op_done(n, 0), in_done(p.ins.size(), 0), out_fin(p.outs.size(), 0);
  auto out_done = [&](int j) { return p.outs[j].copy ? out_fin[j] != 0 : op_done[p.outs[j].after] != 0; };
  double t = 0.0;
  for (int b : p.resident) { take(b); where[b] = 2; }
  int kc = 0, hi = 0, di = 0;
  const int n_in = (int)p.ins.size(), n_d = (int)d2h_list.size();
  bool c_run = false, h_run = false, d_run = false;
  double c_end = 0, h_rem = 0, d_rem = 0, h_lat = 0, d_lat = 0, last_op_end = 0;
  while (true) {
    // Start order as the reference's `starters`: with copies on the compute
    // stream a ready swap-out, then swap-in, then the op, one item at a time.
    bool started = true;
    while (started) {
      started = false;
      for (int s = 0; s < 3; ++s) {
        if (serial && (c_run || h_run || d_run)) break;
        int which = serial ? 2 - s : s;  // 0 op, 1 swap-in, 2 swap-out
        if (which == 0 && !c_run && kc < n) {
          bool ok = true;
          for (int i = need_ptr[kc]; ok && i < need_ptr[kc + 1]; ++i) ok = in_done[i] != 0;
          for (int i = wait_ptr[kc]; ok && i < wait_ptr[kc + 1]; ++i) ok = out_done(p.op_waits[i].second);
          if (ok) {
            int o = order[kc];
            // Recomputations before this op: each chain's ops run again, the
            // buffers they make for the chain alone held until this op ends.
            double extra = 0.0;
            // Remakes before one op share their runs (the reference's ``ran`` and
            // ``alias``): an op an earlier chain here ran is not run again, its
            // outputs read where that run left them; where that run made this
            // chain's own value as its temporary, the value is this chain's.
            if (recomputes) {   // the search's programs have none: no work per op
              ran_op.clear();
              ran_ptr.assign(1, 0);
              ran_out.clear();
            }
            for (int ri = recomputes ? rec_at[kc] : 0; recomputes && ri < rec_at[kc + 1]; ++ri) {
              int rb = p.rec_buf[ri];
              const bool again = where[rb] != 0;
              if (again && std::find(temps[kc].begin(), temps[kc].end(), rb) == temps[kc].end()) {
                r.status = 4; return r;
              }
              bool moved_in = false;
              made.clear();
              made.push_back(rb);
              alias.clear();
              auto is_made = [&](int b) {
                return std::find(made.begin(), made.end(), b) != made.end();
              };
              auto copy_of = [&](int b) {
                if (p.rec_fresh_ptr.empty()) return b;
                for (int f = p.rec_fresh_ptr[ri]; f < p.rec_fresh_ptr[ri + 1]; ++f)
                  if (p.rec_fresh[2 * f] == b) return p.rec_fresh[2 * f + 1];
                return b;
              };
              auto alias_of = [&](int b) {
                // The reference's dict: a later entry for one name wins.
                for (size_t e = alias.size(); e >= 2; e -= 2) if (alias[e - 2] == b) return alias[e - 1];
                return b;
              };
              for (int q = p.rec_ptr[ri]; q < p.rec_ptr[ri + 1]; ++q) {
                int op = p.rec_ops[q];
                named.clear();
                for (int i = g.out_ptr[op]; i < g.out_ptr[op + 1]; ++i) named.push_back(copy_of(g.out[i]));
                int seen = -1;
                for (size_t e = 0; e < ran_op.size(); ++e) if (ran_op[e] == op) seen = (int)e;
                if (seen >= 0) {
                  for (size_t i = 0; i < named.size(); ++i) {
                    int& was = ran_out[ran_ptr[seen] + i];
                    int b = named[i];
                    if (was == b) continue;
                    if (b != rb) {
                      alias.push_back(b);
                      alias.push_back(was);
                      continue;
                    }
                    auto it = std::find(temps[kc].begin(), temps[kc].end(), was);
                    if (it == temps[kc].end()) { r.status = 4; return r; }
                    temps[kc].erase(it);
                    give(was);
                    take(rb);
                    where[rb] = 2;
                    was = rb;
                    moved_in = true;
                  }
                  continue;
                }
                for (int i = g.in_ptr[op]; i < g.in_ptr[op + 1]; ++i) {
                  int b = alias_of(copy_of(g.in[i]));
                  if (!is_made(b) && where[b] != 2) { r.status = 4; return r; }
                }
                for (int b : named) {
                  if (is_made(b) && !(again && b == rb)) continue;
                  if (where[b] != 0) { r.status = 4; return r; }
                  take(b);
                  where[b] = 2;
                  made.push_back(b);
                  temps[kc].push_back(b);
                }
                ran_op.push_back(op);
                ran_out.insert(ran_out.end(), named.begin(), named.end());
                ran_ptr.push_back((int)ran_out.size());
                extra += g.op_time[op];
              }
              if (again) temps[kc].erase(std::find(temps[kc].begin(), temps[kc].end(), rb));
              else if (!moved_in) { take(rb); where[rb] = 2; }
            }
            recompute_s += extra;
            for (int i = g.in_ptr[o]; i < g.in_ptr[o + 1]; ++i)
              if (where[g.in[i]] != 2) { r.status = 4; return r; }
            for (int i = g.out_ptr[o]; i < g.out_ptr[o + 1]; ++i) { take(g.out[i]); where[g.out[i]] = 2; }
            c_run = true;
            c_end = t + extra + g.op_time[o];
            started = true;
          }
        } else if (which == 1 && !h_run && hi < n_in) {
          const InRec& x = p.ins[hi];
          bool waited = true;
          if (p.in_wait_ptr.empty()) waited = x.wait < 0 || out_done(x.wait);
          else
            for (int i = p.in_wait_ptr[hi]; waited && i < p.in_wait_ptr[hi + 1]; ++i)
              waited = out_done(p.in_waits[i]);
          if ((x.trigger < 0 || op_done[x.trigger]) && waited && (x.own < 0 || out_done(x.own))) {
            if (where[x.buf] != 0) { r.status = 4; return r; }
            take(x.buf);
            h_run = true;
            h_rem = (double)g.buf_bytes[x.buf];
            h_lat = latency;
            r.h2d_bytes += g.buf_bytes[x.buf];
            started = true;
          }
        } else if (which == 2 && !d_run && di < n_d) {
          const OutRec& x = p.outs[d2h_list[di]];
          if (op_done[x.after]) {
            d_run = true;
            d_rem = (double)g.buf_bytes[x.buf];
            d_lat = latency;
            r.d2h_bytes += g.buf_bytes[x.buf];
            started = true;
          }
        }
      }
    }
    if (!(c_run || h_run || d_run)) break;
    double rh = !d_run ? h2d_bw : std::min(h2d_bw, duplex / 2);
    double rd = !h_run ? d2h_bw : std::min(d2h_bw, duplex / 2);
    double th = h_run ? t + h_lat + h_rem / rh : INF;
    double td = d_run ? t + d_lat + d_rem / rd : INF;
    double te = std::min(std::min(c_run ? c_end : INF, th), td);
    double dt = te - t;
    now = te;
    if (c_run && c_end == te) {
      int o = order[kc];
      op_done[kc] = 1;
      last_op_end = te;
      for (int pass = 0; pass < 2; ++pass) {
        int lo = pass ? g.out_ptr[o] : g.in_ptr[o], hi2 = pass ? g.out_ptr[o + 1] : g.in_ptr[o + 1];
        const int32_t* arr = pass ? g.out : g.in;
        for (int i = lo; i < hi2; ++i) {
          int b = arr[i];
          if (!g.persistent[b] && !g.kept[b] && last[b] == kc) give(b);
        }
      }
      for (int i = drop_ptr[kc]; i < drop_ptr[kc + 1]; ++i) give(p.outs[drops[i]].buf);
      if (!temps.empty()) for (int b : temps[kc]) give(b);
      if (!p.held_for.empty())
        for (int b : p.held_for[kc])
          if (last[b] == kc && where[b] != 0) give(b);
      c_run = false;
      kc++;
    }
    if (h_run) {
      if (th == te) { where[p.ins[hi].buf] = 2; in_done[hi] = 1; h_run = false; hi++; }
      else if (dt <= h_lat) h_lat -= dt;
      else { h_rem -= rh * (dt - h_lat); h_lat = 0.0; }
    }
    if (d_run) {
      if (td == te) { give(p.outs[d2h_list[di]].buf); out_fin[d2h_list[di]] = 1; d_run = false; di++; }
      else if (dt <= d_lat) d_lat -= dt;
      else { d_rem -= rd * (dt - d_lat); d_lat = 0.0; }
    }
    t = te;
  }
  if (kc < n || hi < n_in || di < n_d) { r.status = 3; return r; }
  if (over) { r.status = 2; return r; }
  double total = 0.0;
  for (int k = 0; k < n; ++k) total += g.op_time[order[k]];
  total += recompute_s;  // recomputation is work, not waiting
  r.step = t;
  r.stall = std::max(0.0, last_op_end - total);
  r.peak = peak + small_pool;
  return r;
}

}  // namespace

extern "C" {

// Plan and simulate one (schedule, allocation).  Returns 0 on success,
// 1 if the allocation is infeasible, 2/3/4 if the planned program is one the
// reference simulator rejects (a planner bug; see SimOut::status).
// metrics: [step_time_s, ideal_time_s, stall_s]; counts_out: [peak_bytes,
// h2d_bytes, d2h_bytes, n_outs, n_ins, n_op_waits, n_resident, passes].
// Detail arrays may be null; if given they must hold `cap` entries
// (resident: n_bufs).
int tfswap_plan_simulate(
    int n_ops, const double* op_time, int n_bufs, const int64_t* buf_bytes,
    const int8_t* persistent, const int8_t* pinned, const int8_t* modified, const int8_t* kept,
    const int32_t* in_ptr, const int32_t* in, const int8_t* in_write, const int32_t* out_ptr,
    const int32_t* out, const int32_t* order, const int32_t* buf_class, int n_classes,
    const int64_t* class_count, const int64_t* class_bytes, int64_t small_pool_bytes,
    double h2d_bw, double d2h_bw, double duplex_bw, double copy_latency, int copies_on_compute,
    double margin, int params_start_on_host,
    double* metrics, int64_t* counts_out, int64_t* class_peak, int64_t cap, int32_t* d_out,
    int32_t* d_in, int32_t* d_wait, int32_t* d_resident) {
  Graph g{n_ops, n_bufs, op_time, buf_bytes, persistent, pinned, modified, kept,
          in_ptr, in, out_ptr, out, in_write};
  Scan scan(g, order, buf_class, n_classes, class_count, h2d_bw, d2h_bw, margin, copy_latency);
  std::vector<int> pinned_pers, start, end, effective, next;
  for (int b = 0; b < n_bufs; ++b)
    if (persistent[b] && pinned[b]) pinned_pers.push_back(b);
  int passes = 1;
  if (!scan.run(pinned_pers, false, end)) return 1;
  start = params_start_on_host ? pinned_pers : end;
  if (start != pinned_pers) {
    std::vector<char> in_end(n_bufs), is_removed(n_bufs);
    bool converged = false;
    for (int it = 0; it < 64; ++it) {
      ++passes;
      if (!scan.run(start, true, end)) return 1;
      std::fill(in_end.begin(), in_end.end(), 0);
      std::fill(is_removed.begin(), is_removed.end(), 0);
      for (int b : end) in_end[b] = 1;
      for (int b : scan.removed) is_removed[b] = 1;
      effective.clear();
      for (int b : start) if (!is_removed[b]) effective.push_back(b);
      bool subset = true;
      for (int b : effective) if (!in_end[b]) { subset = false; break; }
      if (subset) { start = effective; converged = true; break; }
      next.clear();
      for (int b : effective) if (in_end[b]) next.push_back(b);
      start = next;
    }
    if (!converged) return 3;
  }
  {
    std::vector<char> in_start(n_bufs, 0);
    for (int b : start) in_start[b] = 1;
    for (int b : end)
      if (!in_start[b]) scan.outs.push_back({b, scan.last_use[b], scan.dirty[b] != 0});
  }
  Program p;
  canonical(start, scan.outs, scan.ins, scan.op_waits, &p);
  SimOut s = simulate(g, order, buf_class, n_classes, class_count, class_bytes, small_pool_bytes,
                      p, scan.last, h2d_bw, d2h_bw, duplex_bw, copy_latency,
                      copies_on_compute != 0, class_peak);
  if (s.status) return s.status;
  metrics[0] = s.step;
  metrics[1] = n_ops ? scan.iend[n_ops - 1] : 0.0;
  metrics[2] = s.stall;
  counts_out[0] = s.peak;
  counts_out[1] = s.h2d_bytes;
  counts_out[2] = s.d2h_bytes;
  counts_out[3] = (int64_t)p.outs.size();
  counts_out[4] = (int64_t)p.ins.size();
  counts_out[5] = (int64_t)p.op_waits.size();
  counts_out[6] = (int64_t)p.resident.size();
  counts_out[7] = passes;
  if (d_out && (int64_t)p.outs.size() <= cap && (int64_t)p.ins.size() <= cap &&
      (int64_t)p.op_waits.size() <= cap) {
    for (size_t j = 0; j < p.outs.size(); ++j) {
      d_out[3 * j] = p.outs[j].buf; d_out[3 * j + 1] = p.outs[j].after; d_out[3 * j + 2] = p.outs[j].copy;
    }
    for (size_t i = 0; i < p.ins.size(); ++i) {
      const InRec& x = p.ins[i];
      d_in[5 * i] = x.buf; d_in[5 * i + 1] = x.trigger; d_in[5 * i + 2] = x.wait;
      d_in[5 * i + 3] = x.own; d_in[5 * i + 4] = x.need;
    }
    for (size_t i = 0; i < p.op_waits.size(); ++i) {
      d_wait[2 * i] = p.op_waits[i].first; d_wait[2 * i + 1] = p.op_waits[i].second;
    }
    for (size_t i = 0; i < p.resident.size(); ++i) d_resident[i] = p.resident[i];
  }
  return 0;
}

// Simulate a given program (the reference's run_program: one device, copies in
// plan order, no events).  Records as in program.py, flattened: outs (buf,
// after, copy) x n_outs; ins (buf, trigger, own, need) x n_ins with their waits
// in CSR (in_wait_ptr: n_ins + 1); op_waits (position, out) x n_waits;
// recomputes (buf, need) x n_recs, in program order (by need), their ops in CSR.
// Returns 0, or 2/3/4 as SimOut::status (5: more allocation events than
// event_cap).  metrics: [step_time_s, stall_s]; counts_out: [peak_bytes,
// h2d_bytes, d2h_bytes, n_events].  With event_cap > 0 the pool's allocation
// events in order: event_t (time) and event_rec (take, buf, class, object) x 4.
int tfswap_simulate_program(
    int n_ops, const double* op_time, int n_bufs, const int64_t* buf_bytes,
    const int8_t* persistent, const int8_t* pinned, const int8_t* modified, const int8_t* kept,
    const int32_t* in_ptr, const int32_t* in, const int8_t* in_write, const int32_t* out_ptr,
    const int32_t* out, const int32_t* order, const int32_t* buf_class, int n_classes,
    const int64_t* class_count, const int64_t* class_bytes, int64_t small_pool_bytes,
    double h2d_bw, double d2h_bw, double duplex_bw, double copy_latency, int copies_on_compute,
    int n_resident, const int32_t* resident, int n_outs, const int32_t* outs, int n_ins,
    const int32_t* ins, const int32_t* in_wait_ptr, const int32_t* in_waits, int n_waits,
    const int32_t* op_waits, int n_recs, const int32_t* recs, const int32_t* rec_ptr,
    const int32_t* rec_ops, const int32_t* rec_fresh_ptr, const int32_t* rec_fresh, double* metrics, int64_t* counts_out, int64_t* class_peak,
    int64_t event_cap, double* event_t, int32_t* event_rec) {
  Graph g{n_ops, n_bufs, op_time, buf_bytes, persistent, pinned, modified, kept,
          in_ptr, in, out_ptr, out, in_write};
  Program p;
  p.resident.assign(resident, resident + n_resident);
  for (int j = 0; j < n_outs; ++j) p.outs.push_back({outs[3 * j], outs[3 * j + 1], outs[3 * j + 2] != 0});
  for (int i = 0; i < n_ins; ++i)
    p.ins.push_back({ins[4 * i], ins[4 * i + 1], -1, ins[4 * i + 2], ins[4 * i + 3]});
  p.in_wait_ptr.assign(in_wait_ptr, in_wait_ptr + n_ins + 1);
  p.in_waits.assign(in_waits, in_waits + in_wait_ptr[n_ins]);
  for (int i = 0; i < n_waits; ++i) p.op_waits.push_back({op_waits[2 * i], op_waits[2 * i + 1]});
  for (int i = 0; i < n_recs; ++i) { p.rec_buf.push_back(recs[2 * i]); p.rec_need.push_back(recs[2 * i + 1]); }
  p.rec_ptr.assign(rec_ptr, rec_ptr + n_recs + 1);
  p.rec_ops.assign(rec_ops, rec_ops + rec_ptr[n_recs]);
  p.rec_fresh_ptr.assign(rec_fresh_ptr, rec_fresh_ptr + n_recs + 1);
  p.rec_fresh.assign(rec_fresh, rec_fresh + 2 * rec_fresh_ptr[n_recs]);
  // The position of each buffer's last read or write (the reference's `last`).
  std::vector<int> last(n_bufs, -1);
  for (int k = 0; k < n_ops; ++k) {
    int o = order[k];
    for (int i = in_ptr[o]; i < in_ptr[o + 1]; ++i) last[in[i]] = k;
    for (int i = out_ptr[o]; i < out_ptr[o + 1]; ++i) last[out[i]] = k;
  }
  // A checkpoint (the reference's held_for) is held until the op of the
  // recomputation that reads it ends.
  for (int ri = 0; ri < n_recs; ++ri) {
    int need = p.rec_need[ri];
    std::vector<int> made{p.rec_buf[ri]};
    auto copy_of = [&](int b) {
      for (int f = p.rec_fresh_ptr[ri]; f < p.rec_fresh_ptr[ri + 1]; ++f)
        if (p.rec_fresh[2 * f] == b) return p.rec_fresh[2 * f + 1];
      return b;
    };
    for (int q = p.rec_ptr[ri]; q < p.rec_ptr[ri + 1]; ++q) {
      int op = p.rec_ops[q];
      for (int i = in_ptr[op]; i < in_ptr[op + 1]; ++i) {
        int b = copy_of(in[i]);
        if (std::find(made.begin(), made.end(), b) == made.end() && last[b] >= 0 &&
            last[b] < need && !persistent[b] && !kept[b]) {
          last[b] = need;
          if (p.held_for.empty()) p.held_for.resize(n_ops);
          p.held_for[need].push_back(b);
        }
      }
      for (int i = out_ptr[op]; i < out_ptr[op + 1]; ++i) made.push_back(copy_of(out[i]));
    }
  }
  std::vector<AllocEvent> events;
  SimOut s = simulate(g, order, buf_class, n_classes, class_count, class_bytes, small_pool_bytes,
                      p, last, h2d_bw, d2h_bw, duplex_bw, copy_latency, copies_on_compute != 0,
                      class_peak, event_cap > 0 ? &events : nullptr);
  if (s.status) return s.status;
  metrics[0] = s.step;
  metrics[1] = s.stall;
  counts_out[0] = s.peak;
  counts_out[1] = s.h2d_bytes;
  counts_out[2] = s.d2h_bytes;
  counts_out[3] = (int64_t)events.size();
  if ((int64_t)events.size() > event_cap) return event_cap > 0 ? 5 : 0;
  for (size_t i = 0; i < events.size(); ++i) {
    event_t[i] = events[i].t;
    event_rec[4 * i] = events[i].take;
    event_rec[4 * i + 1] = events[i].buf;
    event_rec[4 * i + 2] = events[i].cls;
    event_rec[4 * i + 3] = events[i].obj;
  }
  return 0;
}

// The shared pool layout's packing (tfswap/core/layout.py `_place`, which this
// follows exactly): objects in `order`, each at the lowest offset where it
// overlaps in address only placed objects whose busy sets it does not meet.
// Busy sets: object r's intervals [iv_start, iv_end) for i in
// iv_ptr[r]..iv_ptr[r+1], in event positions; two sets meet where one is busy
// at a position where some object's interval starts (the Python rows over the
// distinct starts).  size[r]: the object's aligned bytes; offset[r] (out).
int tfswap_place_objects(int n_obj, const int32_t* iv_ptr, const int64_t* iv_start,
                         const int64_t* iv_end, const int32_t* order, const int64_t* size,
                         int64_t* offset) {
  const int n_iv = iv_ptr[n_obj];
  std::vector<int64_t> starts(iv_start, iv_start + n_iv);
  if (starts.empty()) starts.push_back(0);
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  const size_t words = (starts.size() + 63) / 64;
  std::vector<uint64_t> rows((size_t)n_obj * words, 0);
  for (int r = 0; r < n_obj; ++r) {
    uint64_t* row = &rows[(size_t)r * words];
    for (int i = iv_ptr[r]; i < iv_ptr[r + 1]; ++i) {
      size_t a = std::lower_bound(starts.begin(), starts.end(), iv_start[i]) - starts.begin();
      size_t b = std::lower_bound(starts.begin(), starts.end(), iv_end[i]) - starts.begin();
      for (size_t x = a; x < b; ++x) row[x >> 6] |= uint64_t(1) << (x & 63);
    }
  }
  std::vector<int> placed;
  placed.reserve(n_obj);
  std::vector<int64_t> lo(n_obj, 0), hi(n_obj, 0);
  std::vector<std::pair<int64_t, int64_t>> clash;
  for (int k = 0; k < n_obj; ++k) {
    const int r = order[k];
    const uint64_t* row = &rows[(size_t)r * words];
    clash.clear();
    for (int q : placed) {
      const uint64_t* other = &rows[(size_t)q * words];
      for (size_t w = 0; w < words; ++w) {
        if (row[w] & other[w]) {
          clash.emplace_back(lo[q], hi[q]);
          break;
        }
      }
    }
    std::sort(clash.begin(), clash.end());
    int64_t off = 0;
    for (const auto& ab : clash) {
      if (off + size[r] <= ab.first) break;
      off = std::max(off, ab.second);
    }
    offset[r] = off;
    lo[r] = off;
    hi[r] = off + size[r];
    placed.push_back(r);
  }
  return 0;
}

}  // extern "C"

// ---------------------------------------------------------------------------
// The byte-cap scan: a line-by-line port of tfswap/core/byte_planner.py
// (_ByteScan.run and the methods it calls).  What depends on the order alone
// (uses, releases, ideal times) and the value chains of the ops that may run
// again come from Python as arrays (byte_planner._Static, _Chains); the scan
// returns its records unsorted, and Python makes the Program (canonical,
// inputs_back).  Segments (_ByteScan._segment) ask for chains at positions
// other than a buffer's next use: those come from Python through a callback
// (ChainAtFn), each (buffer, position) once per scan.  tests/core/test_byte_planner.py checks the two give the same
// programs.

namespace {

// A heap entry: (-next use, last use, buffer, version) as in the reference;
// rank is the cheap heap's first key (0 in the main heap); chain: the chain
// of the buffer's drop (the reference's chain_of at the time of the push).
struct BEntry { int64_t nneed; int k, b, v; double rank; int chain; };
// std heaps are max-heaps: "greater" makes the smallest tuple the top, as heapq.
struct BEntryGreater {
  bool operator()(const BEntry& x, const BEntry& y) const {
    if (x.rank != y.rank) return x.rank > y.rank;
    if (x.nneed != y.nneed) return x.nneed > y.nneed;
    if (x.k != y.k) return x.k > y.k;
    if (x.b != y.b) return x.b > y.b;
    return x.v > y.v;
  }
};
struct BOut { int buf, after, copy; };
struct BIn { int buf, trigger, own, need; std::vector<int> waits; };
struct BRec { int buf, drop, need, chain; };
// Python's _Chains.at(b, need) for a (buffer, position) the per-slot chains do
// not cover (a segment's remakes): the chain id, or -1 (None); writes the
// chain's time and [n_made, made..., n_inputs, inputs...] into buf.
typedef int (*ChainAtFn)(int b, int need, double* time, int32_t* buf);
// One remake a drop sets (_ByteScan._segment's dict entries).
struct BRemake { int buf, at, chain; };

struct ByteScan {
  // Inputs.
  int n, B;
  const int32_t *read_ptr, *reads, *alloc_ptr, *allocs, *rel_ptr, *rels, *use_ptr, *uses;
  const int32_t *last, *movable;
  const int64_t* nb;
  const double *istart, *iend;
  double h2d, d2h, latency, lookahead, margin;
  bool has_lookahead;
  int64_t cap;
  // Chains (may be empty: no recomputation).
  const int32_t* slot_chain;   // per entry of uses: the chain for that next use, or -1
  const double* chain_time;
  const int32_t *made_ptr, *made, *inp_ptr, *inp;
  double share_s_per_byte;
  bool cheapest, chains;
  int n_chains = 0;           // the chains the arrays hold; ids from n_chains on: chain_at
  ChainAtFn chain_at_fn = nullptr;
  int64_t segment_bytes = 0;  // _ByteScan.segment_bytes
  const int64_t* floor_at = nullptr;   // _ByteScan.floor (null: no such refusal)
  // Chains met through chain_at (id - n_chains): made and inputs, ascending.
  std::vector<std::vector<int>> dyn_made, dyn_inp;
  std::vector<double> dyn_time;
  std::vector<char> dyn_known;
  std::unordered_map<int64_t, int> at_memo;   // b * (never + 1) + need -> chain or -1
  std::vector<int32_t> cb_buf;
  // State.
  int64_t never;
  std::vector<int64_t> occ;
  std::vector<char> resident;
  std::vector<int> cursor, version, last_use, pending_out, last_out, stamp;
  std::vector<int> remake_drop, remake_chain, remake_at;  // -1: not dropped
  std::vector<std::vector<int>> readers;   // buffer -> the dropped buffers whose chains read it
  std::vector<int64_t> held;               // position -> the bytes its pending remakes make
  std::vector<BEntry> heap, cheap;
  bool retry = false;            // _ByteScan.retry
  std::vector<BEntry> refused;   // refused by segment() at refused_k: back at the next k
  int refused_k = -1;
  // _ByteScan.ext and ext_release: checkpoints held until the last remake that
  // reads them, and the checkpoints each position releases.
  std::vector<int> ext;
  std::vector<std::vector<int>> ext_release;
  // _ByteScan.temps_for: key t * (never + 1) + need -> the remakes making t there.
  std::unordered_map<int64_t, int> temps_for;
  bool shared = false;   // _ByteScan.shared: remakes before one op share what they make
  std::unordered_map<int64_t, int> made_at;   // _ByteScan.made_at (same keys)
  int temps_k = -1;                 // _ByteScan.temps_at: (k, the temporaries in occ[k])
  std::vector<int> temps_counted;
  std::vector<BOut> outs;
  std::vector<BIn> ins;
  std::vector<std::pair<int, int>> op_waits;
  std::vector<BRec> recs;
  int front = 0;
  int64_t lazy = 0;
  int fail_k = -1;
  int64_t fail_bytes = 0;

  const int32_t* made_b(int ch) const {
    return ch < n_chains ? made + made_ptr[ch] : dyn_made[ch - n_chains].data();
  }
  const int32_t* made_e(int ch) const {
    return ch < n_chains ? made + made_ptr[ch + 1]
                         : dyn_made[ch - n_chains].data() + dyn_made[ch - n_chains].size();
  }
  const int32_t* inp_b(int ch) const {
    return ch < n_chains ? inp + inp_ptr[ch] : dyn_inp[ch - n_chains].data();
  }
  const int32_t* inp_e(int ch) const {
    return ch < n_chains ? inp + inp_ptr[ch + 1]
                         : dyn_inp[ch - n_chains].data() + dyn_inp[ch - n_chains].size();
  }
  double time_of(int ch) const {
    return ch < n_chains ? chain_time[ch] : dyn_time[ch - n_chains];
  }
  int64_t made_bytes(int ch) const {
    int64_t t = 0;
    for (const int32_t* m = made_b(ch); m != made_e(ch); ++m) t += nb[*m];
    return t;
  }
  // _Chains.at(b, need): a chain id, or -1.
  int chain_at(int b, int need) {
    int64_t key = (int64_t)b * (never + 1) + need;
    auto it = at_memo.find(key);
    if (it != at_memo.end()) return it->second;
    double t = 0.0;
    int ch = chain_at_fn ? chain_at_fn(b, need, &t, cb_buf.data()) : -1;
    if (ch >= n_chains) {
      size_t i = (size_t)(ch - n_chains);
      if (i >= dyn_made.size()) {
        dyn_made.resize(i + 1);
        dyn_inp.resize(i + 1);
        dyn_time.resize(i + 1, 0.0);
        dyn_known.resize(i + 1, 0);
      }
      if (dyn_known[i]) {
        at_memo.emplace(key, ch);
        return ch;
      }
      dyn_known[i] = 1;
      const int32_t* p = cb_buf.data();
      int n_made = *p++;
      dyn_made[i].assign(p, p + n_made);
      p += n_made;
      int n_inp = *p++;
      dyn_inp[i].assign(p, p + n_inp);
      dyn_time[i] = t;
    }
    at_memo.emplace(key, ch);
    return ch;
  }
  static void discard(std::vector<int>& v, int x) {
    auto it = std::find(v.begin(), v.end(), x);
    if (it != v.end()) v.erase(it);
  }
  void temps_add(int64_t key) { ++temps_for[key]; }
  void temps_remove(int64_t key) { --temps_for[key]; }
  int64_t key_of(int t, int pos) const { return (int64_t)t * (never + 1) + pos; }
  int count_of(const std::unordered_map<int64_t, int>& m, int64_t key) const {
    auto it = m.find(key);
    return it == m.end() ? 0 : it->second;
  }
  // _ByteScan._make and _unmake.
  void make(int ch, int at) {
    if (!shared) {
      held[at] += made_bytes(ch);
      return;
    }
    for (const int32_t* m = made_b(ch); m != made_e(ch); ++m)
      if (made_at[key_of(*m, at)]++ == 0) held[at] += nb[*m];
  }
  void unmake(int ch, int at) {
    if (!shared) {
      held[at] -= made_bytes(ch);
      return;
    }
    for (const int32_t* m = made_b(ch); m != made_e(ch); ++m) {
      int64_t key = key_of(*m, at);
      if (--made_at[key] == 0) {   // as the reference's Counter, were it never made
        made_at.erase(key);
        held[at] -= nb[*m];
      }
    }
  }

  int64_t next_use(int b) const {
    int c = cursor[b], n_u = use_ptr[b + 1] - use_ptr[b];
    return c < n_u ? uses[use_ptr[b] + c] : never;
  }
  void add_from(int first, int64_t bytes) {
    for (int i = first; i <= front; ++i) occ[i] += bytes;
    lazy += bytes;
  }
  void hold(int b, int first) {
    resident[b] = 1;
    ++version[b];
    add_from(first, nb[b]);
  }
  void in_flight(const std::vector<int>& evicted, int taken) {
    for (int j : evicted) {
      const BOut& o = outs[j];
      for (int i = o.after + 1; i < taken; ++i) occ[i] += nb[o.buf];
    }
  }
  bool temp_taken(int64_t key) const { return count_of(temps_for, key) > 0; }
  void push(std::vector<BEntry>& h, const BEntry& e) {
    h.push_back(e);
    std::push_heap(h.begin(), h.end(), BEntryGreater());
  }
  BEntry pop(std::vector<BEntry>& h) {
    std::pop_heap(h.begin(), h.end(), BEntryGreater());
    BEntry e = h.back();
    h.pop_back();
    return e;
  }

  void use(int b, int k) {
    last_use[b] = k;
    const int32_t* u = uses + use_ptr[b];
    int c = cursor[b], n_u = use_ptr[b + 1] - use_ptr[b];
    while (c < n_u && u[c] <= k) ++c;
    cursor[b] = c;
    int v = ++version[b];
    if (movable[b] && last[b] != k) {
      int64_t need = c < n_u ? u[c] : never;
      BEntry e{-need, k, b, v, 0.0, -1};
      push(heap, e);
      int ch = (chains && c < n_u) ? slot_chain[use_ptr[b] + c] : -1;
      if (ch >= 0 && time_of(ch) <= (double)nb[b] * share_s_per_byte) {
        e.chain = ch;
        e.rank = cheapest ? time_of(ch) / (double)nb[b] : 0.0;
        push(cheap, e);
      }
    }
  }

  int evict(int e) {
    int q = last_use[e];
    resident[e] = 0;
    ++version[e];
    add_from(q + 1, -nb[e]);
    outs.push_back(BOut{e, q, 1});
    int j = (int)outs.size() - 1;
    last_out[e] = j;
    pending_out[e] = next_use(e) < never ? j : -1;
    return j;
  }

  // _ByteScan._checkpoint.
  bool checkpoint(int i, int at) const { return last[i] >= 0 && last[i] < at && movable[i]; }

  bool drop_one(int k) {
    if (retry && refused_k < k) {
      for (const BEntry& e : refused) push(cheap, e);
      refused.clear();
      refused_k = k;
    }
    std::vector<BEntry> skipped;
    bool dropped = false;
    while (!cheap.empty()) {
      BEntry entry = pop(cheap);
      int b = entry.b;
      if (!resident[b] || version[b] != entry.v) continue;
      if (stamp[b] == k || -entry.nneed <= (int64_t)k) {
        skipped.push_back(entry);
        continue;
      }
      std::vector<BRemake> remakes;
      if (!segment(b, (int)(-entry.nneed), entry.chain, k, remakes)) {
        if (retry) refused.push_back(entry);
        continue;
      }
      int q = last_use[b];
      resident[b] = 0;
      ++version[b];
      add_from(q + 1, -nb[b]);
      outs.push_back(BOut{b, q, 0});
      for (const BRemake& r : remakes) {
        int x = r.buf, j;
        if (x == b) {
          j = (int)outs.size() - 1;
        } else {   // remade earlier than planned: for a remake that reads it
          j = remake_drop[x];
          int old = remake_chain[x], was = remake_at[x];
          unmake(old, was);
          for (const int32_t* m = made_b(old); m != made_e(old); ++m)
            if (*m != x) temps_remove((int64_t)*m * (never + 1) + was);
          for (const int32_t* i = inp_b(old); i != inp_e(old); ++i) discard(readers[*i], x);
        }
        remake_drop[x] = j;
        remake_chain[x] = r.chain;
        remake_at[x] = r.at;
      }
      for (const BRemake& r : remakes) {
        int x = r.buf;
        make(r.chain, r.at);
        for (const int32_t* m = made_b(r.chain); m != made_e(r.chain); ++m)
          if (*m != x) temps_add((int64_t)*m * (never + 1) + r.at);
        for (const int32_t* i = inp_b(r.chain); i != inp_e(r.chain); ++i) {
          std::vector<int>& rd = readers[*i];
          if (std::find(rd.begin(), rd.end(), x) == rd.end()) rd.push_back(x);
          if (checkpoint(*i, r.at) && ext[*i] < r.at) {
            ext[*i] = r.at;
            ext_release[r.at].push_back(*i);
          }
        }
      }
      dropped = true;
      break;
    }
    for (const BEntry& e : skipped) push(cheap, e);
    return dropped;
  }

  // _ByteScan._segment: the remakes dropping b at k sets (false: it may not be
  // dropped); remakes in the reference dict's order (first insertion).
  bool segment(int b, int need, int ch, int k, std::vector<BRemake>& remakes) {
    if (ext[b] >= 0) return false;   // a checkpoint a remake reads: held, not dropped
    int at = need;
    if (!readers[b].empty()) {
      at = INT_MAX;
      for (int y : readers[b]) at = std::min(at, remake_at[y]);
    }
    if (at < need) {
      if (at <= k + 1) return false;
      int got = chain_at(b, at);
      if (got < 0 || time_of(got) > (double)nb[b] * share_s_per_byte) return false;
      ch = got;
    }
    remakes.clear();
    remakes.push_back(BRemake{b, at, ch});
    auto find = [&](int x) -> int {
      for (size_t i = 0; i < remakes.size(); ++i)
        if (remakes[i].buf == x) return (int)i;
      return -1;
    };
    std::vector<int> todo{b};
    while (!todo.empty()) {
      int y = todo.back();
      todo.pop_back();
      BRemake ry = remakes[find(y)];
      for (const int32_t* p = inp_b(ry.chain); p != inp_e(ry.chain); ++p) {
        int x = *p;
        if (x == b) return false;
        int ix = find(x);
        int was = ix >= 0 ? remakes[ix].at : remake_drop[x] >= 0 ? remake_at[x] : -1;
        if (was > ry.at) {
          int got = chain_at(x, ry.at);
          if (got < 0) return false;
          if (ix >= 0) {
            remakes[ix].at = ry.at;
            remakes[ix].chain = got;
          } else {
            remakes.push_back(BRemake{x, ry.at, got});
          }
          todo.push_back(x);
        }
      }
    }
    std::vector<int64_t> temps, freed;   // t * (never + 1) + position
    std::vector<std::pair<int, int64_t>> pos_held;   // position -> bytes, after this drop
    auto held_at = [&](int pos) -> int64_t& {
      for (auto& e : pos_held)
        if (e.first == pos) return e.second;
      pos_held.emplace_back(pos, held[pos]);
      return pos_held.back().second;
    };
    std::unordered_map<int64_t, int> change;   // shared: key -> remakes making it, more
    for (const BRemake& r : remakes) {
      int x = r.buf;
      for (const int32_t* i = inp_b(r.chain); i != inp_e(r.chain); ++i)
        if (checkpoint(*i, r.at) && std::max(last[*i], ext[*i]) < k) return false;
      if (shared) {
        held_at(r.at);
        for (const int32_t* m = made_b(r.chain); m != made_e(r.chain); ++m)
          ++change[key_of(*m, r.at)];
      } else {
        for (const int32_t* m = made_b(r.chain); m != made_e(r.chain); ++m) {
          if (*m == x) continue;
          int64_t key = key_of(*m, r.at);
          if (std::find(temps.begin(), temps.end(), key) != temps.end()) return false;
          temps.push_back(key);
        }
        held_at(r.at) += made_bytes(r.chain);
      }
      if (x != b) {
        int was = remake_at[x], old = remake_chain[x];
        if (shared) {
          held_at(was);
          for (const int32_t* m = made_b(old); m != made_e(old); ++m) --change[key_of(*m, was)];
        } else {
          for (const int32_t* m = made_b(old); m != made_e(old); ++m)
            if (*m != x) freed.push_back(key_of(*m, was));
          held_at(was) -= made_bytes(old);
        }
      }
    }
    for (const auto& e : change) {   // each buffer counted once at each position
      int t = (int)(e.first / (never + 1)), pos = (int)(e.first % (never + 1));
      int had = count_of(made_at, e.first);
      held_at(pos) += nb[t] * ((int64_t)(had + e.second > 0) - (int64_t)(had > 0));
    }
    for (int64_t t : temps)
      if (temp_taken(t) && std::find(freed.begin(), freed.end(), t) == freed.end())
        return false;
    if (floor_at)
      for (const auto& e : pos_held)
        if (e.second + floor_at[e.first] > cap) return false;   // no room for the op's own
    if (remakes.size() > 1)
      for (const auto& e : pos_held)
        if (e.second > segment_bytes) return false;   // a segment within its share
    return true;
  }

  // False: infeasible (fail_k, fail_bytes say where).
  bool make_room(int incoming, int k, int64_t extra, std::vector<int>& evicted) {
    int64_t need = nb[incoming] + extra;
    double in_t = latency + (double)nb[incoming] / h2d;
    double limit = istart[k] + margin;
    std::vector<BEntry> put_back, recent;
    while (occ[k] + need > cap && drop_one(k)) {
    }
    while (occ[k] + need > cap) {
      int e = -1;
      while (!heap.empty()) {
        BEntry entry = pop(heap);
        int b = entry.b;
        if (!resident[b] || version[b] != entry.v) continue;
        if (stamp[b] == k) {
          put_back.push_back(entry);
        } else if (iend[last_use[b]] + latency + (double)nb[b] / d2h + in_t > limit) {
          recent.push_back(entry);
        } else {
          e = b;
          break;
        }
      }
      if (e < 0 && !recent.empty()) {
        size_t best = 0;
        BEntryGreater greater;
        for (size_t i = 1; i < recent.size(); ++i)
          if (greater(recent[best], recent[i])) best = i;
        e = recent[best].b;
        recent.erase(recent.begin() + best);
      }
      if (e < 0) {
        fail_k = k;
        fail_bytes = occ[k] + need;
        return false;
      }
      evicted.push_back(evict(e));
    }
    for (const BEntry& x : put_back) push(heap, x);
    for (const BEntry& x : recent) push(heap, x);
    return true;
  }

  bool bring(int b, int k) {
    return remake_drop[b] >= 0 ? remake(b, k) : swap_in(b, k);
  }

  bool remake(int b, int k) {
    int j = remake_drop[b], ch = remake_chain[b], at = remake_at[b];
    remake_drop[b] = remake_chain[b] = remake_at[b] = -1;
    unmake(ch, at);
    for (const int32_t* p = inp_b(ch); p != inp_e(ch); ++p) discard(readers[*p], b);
    if (at != k) {   // the drop rule makes every remake at its position; never here
      int got = chain_at(b, k);
      if (got >= 0) ch = got;
    }
    int64_t extra = 0;
    if (shared && temps_k != k) {
      temps_k = k;
      temps_counted.clear();
    }
    for (const int32_t* m = made_b(ch); m != made_e(ch); ++m) {
      if (*m == b) continue;
      if (shared) {   // made by an earlier remake before this op: read where it is
        if (resident[*m] || std::find(temps_counted.begin(), temps_counted.end(), *m) !=
                                temps_counted.end())
          continue;
        temps_counted.push_back(*m);
      }
      extra += nb[*m];
    }
    // Copied: bring may meet a new chain, which may grow dyn_inp.
    std::vector<int> inputs(inp_b(ch), inp_e(ch));
    for (int x : inputs) stamp[x] = k;
    for (int x : inputs) {
      if (!resident[x] && !bring(x, k)) return false;
      last_use[x] = std::max(last_use[x], k);
    }
    std::vector<int> evicted;
    if (!make_room(b, k, extra, evicted)) return false;
    for (int e : evicted) op_waits.emplace_back(k, e);
    in_flight(evicted, k);
    occ[k] += extra;
    hold(b, k);
    recs.push_back(BRec{b, j, k, ch});
    return true;
  }

  // Python's bisect_right(iend, x), step for step.
  int bisect_right(double x) const {
    int lo = 0, hi = n;
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (x < iend[mid]) hi = mid; else lo = mid + 1;
    }
    return lo;
  }

  bool swap_in(int b, int k) {
    int64_t bytes = nb[b];
    std::vector<int> evicted;
    if (!make_room(b, k, 0, evicted)) return false;
    int prev = last_out[b];
    int floor = prev >= 0 ? outs[prev].after : -1;  // START
    for (int j : evicted) floor = std::max(floor, outs[j].after);
    if (has_lookahead) {
      double want = istart[k] - lookahead * (latency + (double)bytes / h2d);
      floor = std::max(floor, std::min(k - 1, bisect_right(want) - 1));
    }
    int lo = floor + 1, trigger = floor;
    for (int i = k - 1; i >= lo; --i)
      if (occ[i] + bytes > cap) { trigger = i; break; }
    ins.push_back(BIn{b, trigger, pending_out[b], k, evicted});
    pending_out[b] = -1;
    in_flight(evicted, trigger + 1);
    hold(b, trigger + 1);
    return true;
  }

  bool run(const int32_t* start, int n_start, int64_t start_bytes) {
    never = 2 * (int64_t)n + 2;
    occ.assign(n + 1, start_bytes);
    resident.assign(B, 0);
    cursor.assign(B, 0);
    version.assign(B, 0);
    last_use.assign(B, -1);
    pending_out.assign(B, -1);
    last_out.assign(B, -1);
    stamp.assign(B, -1);
    remake_drop.assign(B, -1);
    remake_chain.assign(B, -1);
    remake_at.assign(B, -1);
    ext.assign(B, -1);
    ext_release.assign(n + 1, {});
    readers.assign(B, {});
    held.assign(n + 1, 0);
    cb_buf.assign(2 * (size_t)B + 2, 0);
    for (int i = 0; i < n_start; ++i) resident[start[i]] = 1;
    for (int k = 0; k < n; ++k) {
      if (k) {
        occ[k] += lazy;
        front = k;
      }
      for (int i = read_ptr[k]; i < read_ptr[k + 1]; ++i) stamp[reads[i]] = k;
      for (int i = alloc_ptr[k]; i < alloc_ptr[k + 1]; ++i) stamp[allocs[i]] = k;
      for (int i = read_ptr[k]; i < read_ptr[k + 1]; ++i)
        if (!resident[reads[i]] && !bring(reads[i], k)) return false;
      for (int i = alloc_ptr[k]; i < alloc_ptr[k + 1]; ++i) {
        int b = allocs[i];
        if (resident[b]) continue;
        std::vector<int> evicted;
        if (!make_room(b, k, 0, evicted)) return false;
        for (int e : evicted) op_waits.emplace_back(k, e);
        in_flight(evicted, k);
        hold(b, k);
      }
      for (int i = read_ptr[k]; i < read_ptr[k + 1]; ++i) use(reads[i], k);
      for (int i = alloc_ptr[k]; i < alloc_ptr[k + 1]; ++i) use(allocs[i], k);
      for (int i = rel_ptr[k]; i < rel_ptr[k + 1]; ++i) {
        int b = rels[i];
        if (resident[b] && ext[b] <= k) {
          resident[b] = 0;
          ++version[b];
          lazy -= nb[b];
        }
      }
      for (int b : ext_release[k]) {
        if (resident[b] && ext[b] == k) {
          resident[b] = 0;
          ++version[b];
          lazy -= nb[b];
        }
      }
    }
    return true;
  }
};

thread_local ByteScan* g_last_scan = nullptr;  // until fetched (same thread)

}  // namespace

extern "C" {

// One byte-cap scan.  Returns 0 (the records wait in the library until
// tfswap_byte_scan_fetch copies them out, in the same thread), or 1: an op
// cannot get its bytes under the cap (fail[0]: its position, fail[1]: the bytes
// it would take).  sizes_out: [n_outs, n_ins, n_waits, n_op_waits, n_recs].
int tfswap_byte_scan(
    int n, int n_bufs, const int32_t* read_ptr, const int32_t* reads, const int32_t* alloc_ptr,
    const int32_t* allocs, const int32_t* rel_ptr, const int32_t* rels, const int32_t* use_ptr,
    const int32_t* uses, const int32_t* last, const int32_t* movable, const int64_t* nbytes,
    const double* istart, const double* iend, int n_start, const int32_t* start,
    int64_t start_bytes, double h2d, double d2h, double latency, int has_lookahead,
    double lookahead, double margin, int64_t cap,
    int has_chains, const int32_t* slot_chain, const double* chain_time,
    const int32_t* made_ptr, const int32_t* made, const int32_t* inp_ptr, const int32_t* inp,
    double share_s_per_byte, int cheapest, int n_chains, ChainAtFn chain_at,
    int64_t segment_bytes, const int64_t* floor, int retry, int shared_temps, int64_t* fail,
    int64_t* sizes_out) {
  delete g_last_scan;
  g_last_scan = nullptr;
  ByteScan* s = new ByteScan();
  s->n = n; s->B = n_bufs;
  s->read_ptr = read_ptr; s->reads = reads; s->alloc_ptr = alloc_ptr; s->allocs = allocs;
  s->rel_ptr = rel_ptr; s->rels = rels; s->use_ptr = use_ptr; s->uses = uses;
  s->last = last; s->movable = movable; s->nb = nbytes; s->istart = istart; s->iend = iend;
  s->h2d = h2d; s->d2h = d2h; s->latency = latency; s->has_lookahead = has_lookahead != 0;
  s->lookahead = lookahead; s->margin = margin; s->cap = cap;
  s->chains = has_chains != 0; s->slot_chain = slot_chain; s->chain_time = chain_time;
  s->made_ptr = made_ptr; s->made = made; s->inp_ptr = inp_ptr; s->inp = inp;
  s->share_s_per_byte = share_s_per_byte; s->cheapest = cheapest != 0;
  s->n_chains = n_chains; s->chain_at_fn = chain_at; s->segment_bytes = segment_bytes;
  s->floor_at = floor;
  s->retry = retry != 0;
  s->shared = shared_temps != 0;
  if (!s->run(start, n_start, start_bytes)) {
    fail[0] = s->fail_k;
    fail[1] = s->fail_bytes;
    delete s;
    return 1;
  }
  int64_t n_waits = 0;
  for (const BIn& r : s->ins) n_waits += (int64_t)r.waits.size();
  sizes_out[0] = (int64_t)s->outs.size();
  sizes_out[1] = (int64_t)s->ins.size();
  sizes_out[2] = n_waits;
  sizes_out[3] = (int64_t)s->op_waits.size();
  sizes_out[4] = (int64_t)s->recs.size();
  g_last_scan = s;
  return 0;
}

// The last scan's records in stream order, as tfswap/core/program.py's
// canonical leaves them (stable sorts on the same keys, out indices renumbered):
// outs [n_outs x 3] (buf, out_after, copy) by (out_after, buf), ins [n_ins x 5]
// (buf, trigger, own_out, need, n_waits) by (need, buf), waits [n_waits] (each
// in's in turn, ascending), op_waits [n x 2] ascending, recs [n x 4] (buf, drop,
// need, chain) by (need, buf) (Python then orders a segment's, at one need, by
// the position of the last op each runs again: program._recompute_order).
int tfswap_byte_scan_fetch(int32_t* outs, int32_t* ins, int32_t* waits, int32_t* op_waits,
                           int32_t* recs) {
  ByteScan* s = g_last_scan;
  if (!s) return 1;
  {
    const size_t n_out = s->outs.size();
    std::vector<int> perm(n_out), new_of(n_out);
    for (size_t j = 0; j < n_out; ++j) perm[j] = (int)j;
    std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) {
      const BOut &x = s->outs[a], &y = s->outs[b];
      return x.after != y.after ? x.after < y.after : x.buf < y.buf;
    });
    std::vector<BOut> sorted_outs(n_out);
    for (size_t j = 0; j < n_out; ++j) {
      new_of[perm[j]] = (int)j;
      sorted_outs[j] = s->outs[perm[j]];
    }
    s->outs.swap(sorted_outs);
    for (BIn& r : s->ins) {
      for (int& w : r.waits) w = new_of[w];
      std::sort(r.waits.begin(), r.waits.end());
      if (r.own >= 0) r.own = new_of[r.own];
    }
    std::stable_sort(s->ins.begin(), s->ins.end(), [](const BIn& x, const BIn& y) {
      return x.need != y.need ? x.need < y.need : x.buf < y.buf;
    });
    for (auto& w : s->op_waits) w.second = new_of[w.second];
    std::sort(s->op_waits.begin(), s->op_waits.end());
    for (BRec& r : s->recs) r.drop = new_of[r.drop];
    std::stable_sort(s->recs.begin(), s->recs.end(), [](const BRec& x, const BRec& y) {
      return x.need != y.need ? x.need < y.need : x.buf < y.buf;
    });
  }
  for (size_t i = 0; i < s->outs.size(); ++i) {
    outs[3 * i] = s->outs[i].buf; outs[3 * i + 1] = s->outs[i].after;
    outs[3 * i + 2] = s->outs[i].copy;
  }
  size_t w = 0;
  for (size_t i = 0; i < s->ins.size(); ++i) {
    const BIn& r = s->ins[i];
    ins[5 * i] = r.buf; ins[5 * i + 1] = r.trigger; ins[5 * i + 2] = r.own;
    ins[5 * i + 3] = r.need; ins[5 * i + 4] = (int32_t)r.waits.size();
    for (int j : r.waits) waits[w++] = j;
  }
  for (size_t i = 0; i < s->op_waits.size(); ++i) {
    op_waits[2 * i] = s->op_waits[i].first; op_waits[2 * i + 1] = s->op_waits[i].second;
  }
  for (size_t i = 0; i < s->recs.size(); ++i) {
    recs[4 * i] = s->recs[i].buf; recs[4 * i + 1] = s->recs[i].drop;
    recs[4 * i + 2] = s->recs[i].need; recs[4 * i + 3] = s->recs[i].chain;
  }
  delete s;
  g_last_scan = nullptr;
  return 0;
}

}  // extern "C"
