// TfswapRetireHandle / TfswapReviveHandle: make every read and write through a
// variable's former resource handle fail with tfswap's message, and undo that.
//
// When tfswap moves a variable to host memory (tfswap/tf/homes.py) the user's
// tf.Variable takes a new handle; its former device resource is emptied to free
// the device memory.  Whatever still holds the former handle and is no Python
// object tfswap can re-point (a tf.data pipeline built before the move, whose
// dataset op copied the handle when it was made; a handle tensor the user kept)
// would then read the empty tensor: a wrong value with no error
// (reduce_sum gives 0.0).  Measured in TF 2.21, nothing else closes that:
//
// * DestroyResourceOp does nothing to an eager variable's handle (it owns its
//   resource: a ref-counting handle), and reads go on succeeding;
// * a resource variable's value cannot be made one whose reads fail with a
//   message of ours: AssignVariableOp refuses another dtype, and every kernel's
//   own errors carry only dtypes, shapes and the handle's fields;
// * re-pointing a dataset's map function (tfswap.tf.homes.follow does) does not
//   change what the dataset reads: its variant copied the handle when it was
//   built, and iterators copy it again;
// * keeping the device copy readable keeps the memory the move is for, and it
//   goes stale as soon as the host copy is updated.
//
// Every copy of a handle tensor shares one buffer, and so one ResourceHandle
// (the dataset's captured inputs, a function's captured inputs, the eager
// tensor itself).  Retiring gives that ResourceHandle tfswap's message as its
// name and a type that is not Var's: every kernel that takes it (read, assign,
// gather, scatter) then fails its type check with an error that quotes the
// name, wherever and however it was copied.  The handle keeps its resource (so
// the emptied variable stays alive for the revival) and its device.  Reviving
// puts the name, type name and type hash back.
//
// The fields are written without a lock (TensorFlow reads them without one):
// tfswap retires a handle between steps, when nothing runs with it.  The type
// hash, the field every kernel checks, is written last.

#include <atomic>
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/type_index.h"

namespace tfswap {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::DEVICE_GPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::ResourceHandle;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TypeIndex;
using ::tensorflow::tstring;

namespace {

// The type a retired handle claims: no resource has it, so no kernel accepts it.
struct RetiredHandle {};

constexpr char kRetiredTypeName[] = "tfswap: a moved variable's former handle";

uint64_t RetiredHash() { return TypeIndex::Make<RetiredHandle>().hash_code(); }

// The one ResourceHandle every copy of the input tensor shares: the kernel
// changes it in place, which is the point.
ResourceHandle& SharedHandle(OpKernelContext* ctx) {
  return const_cast<ResourceHandle&>(ctx->input(0).scalar<ResourceHandle>()());
}

}  // namespace

REGISTER_OP("TfswapRetireHandle")
    .Input("handle: resource")
    .Input("message: string")
    .Output("former_name: string")
    .Output("former_type_name: string")
    .Output("former_hash_code: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Makes every op that takes this resource handle, or any copy of it, fail with an
error quoting `message` (tfswap: a variable's former handle after a move).
Returns the handle's name, type name and type hash, for TfswapReviveHandle.
A handle retired already is refused.
)doc");

REGISTER_OP("TfswapReviveHandle")
    .Input("handle: resource")
    .Input("former_name: string")
    .Input("former_type_name: string")
    .Input("former_hash_code: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Gives a handle retired by TfswapRetireHandle back the name, type name and type
hash it returned; a handle that is not retired is left as it is.
)doc");

class RetireHandleOp : public OpKernel {
 public:
  explicit RetireHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ResourceHandle& handle = SharedHandle(ctx);
    OP_REQUIRES(ctx, handle.hash_code() != RetiredHash(),
                ::tensorflow::errors::FailedPrecondition(
                    "tfswap: this resource handle is retired already: ", handle.name()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = handle.name();
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<tstring>()() = handle.maybe_type_name();
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<int64_t>()() = static_cast<int64_t>(handle.hash_code());
    handle.set_name(std::string(ctx->input(1).scalar<tstring>()()));
    handle.set_maybe_type_name(kRetiredTypeName);
    std::atomic_thread_fence(std::memory_order_release);
    handle.set_hash_code(RetiredHash());
  }
};

class ReviveHandleOp : public OpKernel {
 public:
  explicit ReviveHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ResourceHandle& handle = SharedHandle(ctx);
    if (handle.hash_code() != RetiredHash()) return;
    handle.set_name(std::string(ctx->input(1).scalar<tstring>()()));
    handle.set_maybe_type_name(std::string(ctx->input(2).scalar<tstring>()()));
    std::atomic_thread_fence(std::memory_order_release);
    handle.set_hash_code(static_cast<uint64_t>(ctx->input(3).scalar<int64_t>()()));
  }
};

// An eager op taking a resource runs on the resource's device; the handle and
// the strings live in host memory there too.
REGISTER_KERNEL_BUILDER(Name("TfswapRetireHandle").Device(DEVICE_CPU), RetireHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfswapReviveHandle").Device(DEVICE_CPU), ReviveHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfswapRetireHandle")
                            .Device(DEVICE_GPU)
                            .HostMemory("handle")
                            .HostMemory("message")
                            .HostMemory("former_name")
                            .HostMemory("former_type_name")
                            .HostMemory("former_hash_code"),
                        RetireHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfswapReviveHandle")
                            .Device(DEVICE_GPU)
                            .HostMemory("handle")
                            .HostMemory("former_name")
                            .HostMemory("former_type_name")
                            .HostMemory("former_hash_code"),
                        ReviveHandleOp);

}  // namespace tfswap
