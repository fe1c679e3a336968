// DLPack import/export. bool has no code in DLPack 0.6; it travels as kDLUInt×8 and comes back as
// u8, which is the honest loss.
#include "hk/dlpack.h"

#include "hk/error.h"

namespace hk {
namespace {

DLDataType to_dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return {kDLFloat, 32, 1};
    case DType::F64: return {kDLFloat, 64, 1};
    case DType::F16: return {kDLFloat, 16, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
    case DType::I32: return {kDLInt, 32, 1};
    case DType::I64: return {kDLInt, 64, 1};
    case DType::U8:
    case DType::Bool: return {kDLUInt, 8, 1};
  }
  throw InvalidArgument("dlpack: unknown dtype");
}

DType from_dl_dtype(DLDataType t) {
  if (t.lanes != 1) throw InvalidArgument("dlpack: vector dtypes (lanes > 1) are not supported");
  if (t.code == kDLFloat && t.bits == 32) return DType::F32;
  if (t.code == kDLFloat && t.bits == 64) return DType::F64;
  if (t.code == kDLFloat && t.bits == 16) return DType::F16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::BF16;
  if (t.code == kDLInt && t.bits == 32) return DType::I32;
  if (t.code == kDLInt && t.bits == 64) return DType::I64;
  if (t.code == kDLUInt && t.bits == 8) return DType::U8;
  throw InvalidArgument("dlpack: dtype code " + std::to_string(t.code) + " with " +
                        std::to_string(t.bits) + " bits is not supported by hk");
}

DLDevice to_dl_device(Device d) {
  switch (d.type) {
    case DeviceType::CPU: return {kDLCPU, 0};
    case DeviceType::CUDA: return {kDLCUDA, d.index};
    case DeviceType::ROCM: return {kDLROCM, d.index};
    default: throw InvalidArgument("dlpack: device " + d.str() + " has no DLPack mapping in hk");
  }
}

Device from_dl_device(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost: return Device::cpu();
    case kDLCUDA: return Device{DeviceType::CUDA, d.device_id, 0};
    case kDLROCM: return Device{DeviceType::ROCM, d.device_id, 0};
    default:
      throw InvalidArgument("dlpack: device type " + std::to_string(d.device_type) +
                            " is not supported by hk");
  }
}

struct ExportContext {
  Tensor tensor;  // keeps storage alive; its view owns the shape/strides arrays
  DLManagedTensor managed;
};

}  // namespace

DLTensor to_dltensor(const TensorView& view) {
  DLTensor t{};
  t.data = view.data;
  t.device = to_dl_device(view.device);
  t.ndim = view.ndim;
  t.dtype = to_dl_dtype(view.dtype);
  t.shape = const_cast<int64_t*>(view.shape);
  t.strides = const_cast<int64_t*>(view.strides);
  t.byte_offset = view.byte_offset;
  return t;
}

TensorView from_dltensor(const DLTensor& t) {
  if (t.ndim < 0 || t.ndim > kMaxDims)
    throw InvalidArgument("dlpack: rank " + std::to_string(t.ndim) + " exceeds hk's maximum of " +
                          std::to_string(kMaxDims));
  TensorView v;
  v.data = t.data;
  v.device = from_dl_device(t.device);
  v.dtype = from_dl_dtype(t.dtype);
  v.ndim = t.ndim;
  v.byte_offset = t.byte_offset;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    v.shape[d] = t.shape[d];
    v.strides[d] = t.strides ? t.strides[d] : expected;  // null strides = compact row-major
    if (v.strides[d] < 0) throw InvalidArgument("dlpack: negative strides are not supported");
    expected *= t.shape[d];
  }
  return v;
}

DLManagedTensor* to_dlpack(const Tensor& tensor) {
  auto* ctx = new ExportContext{tensor, {}};
  ctx->managed.dl_tensor = to_dltensor(ctx->tensor.view());
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &ctx->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  if (!managed) throw InvalidArgument("dlpack: null managed tensor");
  TensorView view = from_dltensor(managed->dl_tensor);
  auto storage = std::make_shared<Storage>(
      view.device, view.data, view.nbytes(), [managed](void*) {
        if (managed->deleter) managed->deleter(managed);
      });
  return Tensor(std::move(storage), view);
}

}  // namespace hk
