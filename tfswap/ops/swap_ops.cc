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
// GPU kernels are asynchronous and use the op's DeviceContext, which issues the
// copy on the device-to-host / host-to-device streams; the host side is declared
// HostMemory and allocated pinned (on_host + gpu_compatible) so the DMA engine
// can reach it.  They are compiled and registered here but never executed
// without a GPU.

#include <cstring>

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
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Copies a device tensor into a newly allocated host buffer (tfswap).
The device buffer is released once its remaining readers have run.
)doc");

REGISTER_OP("SwapIn")
    .Input("host_copy: T")
    .Output("tensor: T")
    .Attr("T: type")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Copies a host tensor into a newly allocated device buffer (tfswap).
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

// The CPU kernel behind both ops: a new buffer and a byte copy.  On the
// emulated device SwapOut is placed on the host CPU and SwapIn on the device
// CPU, so the allocation is attributed to the right side in step stats.
class CpuCopyOp : public OpKernel {
 public:
  explicit CpuCopyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& in = ctx->input(0);
    if (!CheckCopyable(ctx, in)) return;
    Tensor* out = nullptr;
    // allocate_output (not forward_input_or_allocate_output): the whole point
    // is a distinct buffer.
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.shape(), &out));
    const auto src = in.tensor_data();
    if (!src.empty()) {
      std::memcpy(const_cast<char*>(out->tensor_data().data()), src.data(),
                  src.size());
    }
  }
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
