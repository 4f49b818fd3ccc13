// SwapOut / SwapIn: the two ops a tfswap plan inserts into a graph.
//
// SwapOut copies a device tensor into a freshly allocated host buffer, SwapIn
// copies a host tensor into a freshly allocated device buffer.  Both are
// stateful so that Grappler never folds, merges or prunes them: a swap that an
// optimizer removed would silently turn a plan that fits into one that does not.
//
// CPU kernels really copy (the emulated device is CPU:0, the host CPU:1; see
// DESIGN.md), so the device buffer of a swapped-out tensor is released when its
// last reader finishes and a new one is allocated by the swap-in.
//
// Emulated link (CPU kernels only): with ``link_bytes_per_s`` > 0 a CPU copy
// also takes the time a link of that bandwidth would.  Each direction (SwapOut:
// device to host, SwapIn: host to device) is one FIFO link, like a GPU's copy
// engine stream: a copy's bytes start moving when it starts or when the
// previous copy in its direction is done, whichever is later, and it is done
// bytes / link_bytes_per_s seconds after that.  The kernel does its memcpy at
// once and then completes (calls ``done``) at that time from a timer thread:
// it sleeps, it does not spin, and it does not hold an executor thread, so
// compute ops keep running while copies are "in flight", as with DMA.  Until
// then its outputs are not available and its inputs are not released (a
// swapped-out device buffer is freed when the copy is done, as in the
// simulator).  0 (the default) keeps the plain memcpy.  GPU kernels ignore the
// attribute: the real link sets their time.
//
// GPU kernels are asynchronous and use the op's DeviceContext, which issues the
// copy on the device-to-host / host-to-device streams; the host side is declared
// HostMemory and allocated pinned (on_host + gpu_compatible) so the DMA engine
// can reach it.  They are compiled and registered here but never executed
// without a GPU.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "tensorflow/core/common_runtime/device.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "pool_allocator.h"

namespace tfswap {

using ::tensorflow::AllocatorAttributes;
using ::tensorflow::AsyncOpKernel;
using ::tensorflow::DataTypeCanUseMemcpy;
using ::tensorflow::DataTypeString;
using ::tensorflow::Device;
using ::tensorflow::DeviceContext;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::errors::Internal;

REGISTER_OP("SwapOut")
    .Input("tensor: T")
    .Output("host_copy: T")
    .Attr("T: type")
    .Attr("link_bytes_per_s: float = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Copies a device tensor into a newly allocated host buffer (tfswap).
The device buffer is released once its remaining readers have run.
link_bytes_per_s: CPU kernel only: > 0 emulates a device-to-host link of this
  bandwidth (the op completes when its bytes would have crossed it); 0: no delay.
)doc");

REGISTER_OP("SwapIn")
    .Input("host_copy: T")
    .Output("tensor: T")
    .Attr("T: type")
    .Attr("link_bytes_per_s: float = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Copies a host tensor into a newly allocated device buffer (tfswap).
link_bytes_per_s: CPU kernel only: > 0 emulates a host-to-device link of this
  bandwidth (the op completes when its bytes would have crossed it); 0: no delay.
)doc");

namespace {

// Only plain-old-data tensors can be moved with a byte copy; strings,
// variants and resource handles are never swap candidates (the planner marks
// them unswappable), so reaching here with one is a planning bug.
bool CheckCopyable(OpKernelContext* ctx, const Tensor& t) {
  if (!DataTypeCanUseMemcpy(t.dtype())) {
    ctx->CtxFailure(InvalidArgument(
        "tfswap cannot swap a tensor of dtype ", DataTypeString(t.dtype()),
        " (only numeric and boolean tensors can be copied byte for byte)"));
    return false;
  }
  return true;
}

using Clock = std::chrono::steady_clock;

// The emulated link: per direction, the time its last reserved copy is done,
// and one timer thread that completes held copies at their deadlines.
class EmulatedLink {
 public:
  static EmulatedLink& Get() {
    static EmulatedLink* link = new EmulatedLink();  // never destroyed: the thread lives on
    return *link;
  }

  // Reserves ``seconds`` of direction ``dir`` (0: device to host, 1: host to
  // device) for a copy that starts at ``start``; returns when it is done.
  Clock::time_point Reserve(int dir, Clock::time_point start, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    Clock::time_point begin = std::max(start, free_at_[dir]);
    free_at_[dir] = begin + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(seconds));
    return free_at_[dir];
  }

  // Runs ``fn`` on the timer thread at ``when`` (or soon after).
  void At(Clock::time_point when, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        std::thread([this] { Loop(); }).detach();
        started_ = true;
      }
      queue_.push(Item{when, seq_++, std::move(fn)});
    }
    cv_.notify_one();
  }

 private:
  struct Item {
    Clock::time_point when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Item& o) const {
      return when != o.when ? when > o.when : seq > o.seq;
    }
  };

  void Loop() {
#ifdef __linux__
    // Linux lets a sleeping thread wake up to 50 us late by default (timer
    // slack); a DMA engine's completion is not that late, and a copy's
    // consumer waits for it, so this thread asks for 1 us.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (queue_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const Clock::time_point when = queue_.top().when;
      if (Clock::now() < when) {
        cv_.wait_until(lock, when);
        continue;
      }
      std::function<void()> fn = std::move(const_cast<Item&>(queue_.top()).fn);
      queue_.pop();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_;
  Clock::time_point free_at_[2] = {Clock::time_point::min(), Clock::time_point::min()};
  uint64_t seq_ = 0;
  bool started_ = false;
};

// The CPU kernel behind both ops: a new buffer and a byte copy, then, on an
// emulated link, completion when the link would have moved the bytes.  On the
// emulated device SwapOut is placed on the host CPU and SwapIn on the device
// CPU, so the allocation is attributed to the right side in step stats.
class CpuCopyOp : public AsyncOpKernel {
 public:
  explicit CpuCopyOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("link_bytes_per_s", &link_bytes_per_s_));
    OP_REQUIRES(ctx, link_bytes_per_s_ >= 0 && std::isfinite(link_bytes_per_s_),
                InvalidArgument("link_bytes_per_s must be a finite number >= 0, got ",
                                link_bytes_per_s_));
    direction_ = type_string() == "SwapOut" ? 0 : 1;
  }

  // Unthrottled, the op is a plain synchronous kernel to the executor, as it
  // was before the emulated link existed (AsyncOpKernel::Compute runs
  // ComputeAsync, which then calls ``done`` before returning); throttled, it is
  // asynchronous, so the executor thread is free while the link is busy.
  AsyncOpKernel* AsAsync() override {
    return link_bytes_per_s_ > 0 ? this : nullptr;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Clock::time_point start = Clock::now();
    const Tensor& in = ctx->input(0);
    if (!CheckCopyable(ctx, in)) {
      done();
      return;
    }
    Tensor* out = nullptr;
    // allocate_output (not forward_input_or_allocate_output): the whole point
    // is a distinct buffer.
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, in.shape(), &out), done);
    const auto src = in.tensor_data();
    if (!src.empty()) {
      std::memcpy(const_cast<char*>(out->tensor_data().data()), src.data(),
                  src.size());
    }
    if (link_bytes_per_s_ <= 0) {
      done();
      return;
    }
    EmulatedLink& link = EmulatedLink::Get();
    const Clock::time_point finish = link.Reserve(
        direction_, start, static_cast<double>(src.size()) / link_bytes_per_s_);
    if (Clock::now() >= finish) {
      done();
      return;
    }
    link.At(finish, std::move(done));
  }

 private:
  float link_bytes_per_s_ = 0;
  int direction_ = 0;
};

class GpuSwapOutOp : public AsyncOpKernel {
 public:
  explicit GpuSwapOutOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    if (!CheckCopyable(ctx, in)) {
      done();
      return;
    }
    AllocatorAttributes host_attr;
    host_attr.set_on_host(true);
    host_attr.set_gpu_compatible(true);  // pinned, so the copy is a real DMA
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->allocate_output(0, in.shape(), &out, host_attr), done);
    if (in.NumElements() == 0) {
      done();
      return;
    }
    DeviceContext* dc = ctx->op_device_context();
    OP_REQUIRES_ASYNC(ctx, dc != nullptr,
                      Internal("SwapOut on GPU has no device context"), done);
    Device* device = static_cast<Device*>(ctx->device());
    dc->CopyDeviceTensorToCPU(&in, name(), device, out,
                              [ctx, done](const absl::Status& s) {
                                ctx->SetStatus(s);
                                done();
                              });
  }
};

class GpuSwapInOp : public AsyncOpKernel {
 public:
  explicit GpuSwapInOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    if (!CheckCopyable(ctx, in)) {
      done();
      return;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, in.shape(), &out), done);
    if (in.NumElements() == 0) {
      done();
      return;
    }
    DeviceContext* dc = ctx->op_device_context();
    OP_REQUIRES_ASYNC(ctx, dc != nullptr,
                      Internal("SwapIn on GPU has no device context"), done);
    Device* device = static_cast<Device*>(ctx->device());
    // By default TF's host-to-device copy first waits for the compute stream,
    // because under the BFC allocator the destination may be memory a kernel
    // still queued on that stream is using; the wait serialises the prefetch
    // behind compute and kills the overlap the plan counts on.  Under the
    // tfswap pool the destination is an object of the plan's size classes
    // that the plan frees (by a swap-out this swap-in waits for, or by a
    // tensor whose last reader precedes the trigger) before the swap-in, so
    // the wait is skipped there, and only there.
    const bool under_pool =
        device->GetAllocator(AllocatorAttributes())->Name() == kPoolAllocatorName;
    dc->CopyCPUTensorToDevice(&in, device, out,
                              [ctx, done](const absl::Status& s) {
                                ctx->SetStatus(s);
                                done();
                              },
                              /*sync_dst_compute=*/!under_pool);
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("SwapOut").Device(::tensorflow::DEVICE_CPU),
                        CpuCopyOp);
REGISTER_KERNEL_BUILDER(Name("SwapIn").Device(::tensorflow::DEVICE_CPU),
                        CpuCopyOp);
REGISTER_KERNEL_BUILDER(
    Name("SwapOut").Device(::tensorflow::DEVICE_GPU).HostMemory("host_copy"),
    GpuSwapOutOp);
REGISTER_KERNEL_BUILDER(
    Name("SwapIn").Device(::tensorflow::DEVICE_GPU).HostMemory("host_copy"),
    GpuSwapInOp);

}  // namespace tfswap
