// copy_view: the one strided copy every layer uses to materialise views and move tensors between
// devices. Same dtype only (dtype conversion is ops::cast). Cross-device copies of non-contiguous
// views are staged through a contiguous buffer on the source device.
#include <cstring>

#include "core/copy_internal.h"
#include "hk/error.h"

namespace hk {
namespace {

void cpu_strided_copy(const TensorView& dst, const TensorView& src) {
  const size_t es = dtype_size(dst.dtype);
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.ptr(), src.ptr(), static_cast<size_t>(n) * es);
    return;
  }
  const int nd = dst.ndim;
  int64_t index[kMaxDims] = {};
  auto* d = static_cast<char*>(dst.ptr());
  auto* s = static_cast<const char*>(src.ptr());
  // Innermost loop over the last dim; the odometer advances the rest.
  const int64_t inner = nd ? dst.shape[nd - 1] : 1;
  const int64_t ds = nd ? dst.strides[nd - 1] : 1, ss = nd ? src.strides[nd - 1] : 1;
  for (int64_t done = 0; done < n; done += inner) {
    int64_t doff = 0, soff = 0;
    for (int k = 0; k < nd - 1; ++k) {
      doff += index[k] * dst.strides[k];
      soff += index[k] * src.strides[k];
    }
    for (int64_t i = 0; i < inner; ++i)
      std::memcpy(d + (doff + i * ds) * es, s + (soff + i * ss) * es, es);
    for (int k = nd - 2; k >= 0; --k) {
      if (++index[k] < dst.shape[k]) break;
      index[k] = 0;
    }
  }
}

}  // namespace

void copy_view(const TensorView& dst, const TensorView& src, Stream stream) {
  if (!same_shape(dst, src) || dst.dtype != src.dtype)
    throw InvalidArgument("copy: destination " + dst.str() + " and source " + src.str() +
                          " must have the same shape and dtype");
  if (dst.numel() == 0) return;
  if (dst.device.is_cpu() && src.device.is_cpu()) {
    cpu_strided_copy(dst, src);
    return;
  }
  const bool known = (dst.device.is_cpu() || dst.device.is_cuda()) &&
                     (src.device.is_cpu() || src.device.is_cuda());
  if (!known)
    throw Unsupported("copy between " + src.device.str() + " and " + dst.device.str() +
                      " is not supported; hk has runtimes for cpu and cuda only");
  if (dst.device.is_cuda() && src.device.is_cuda() && dst.device == src.device) {
    detail::cuda_strided_copy(dst, src, stream);
    return;
  }
  if (dst.is_contiguous() && src.is_contiguous()) {
    detail::cuda_memcpy(dst.ptr(), dst.device, src.ptr(), src.device, dst.nbytes(), stream);
    return;
  }
  Tensor src_c = Tensor::wrap(src).contiguous(stream);
  Tensor staged = Tensor::empty(dst.sizes(), dst.dtype, dst.device, stream);
  detail::cuda_memcpy(staged.view().ptr(), dst.device, src_c.view().ptr(), src.device,
                      dst.nbytes(), stream);
  copy_view(dst, staged.view(), stream);
}

#ifndef HK_HAVE_CUDA
namespace detail {
void cuda_strided_copy(const TensorView&, const TensorView&, Stream) {
  throw Unsupported("hk was built without CUDA; cannot copy on a CUDA device");
}
void cuda_memcpy(void*, Device, const void*, Device, size_t, Stream) {
  throw Unsupported("hk was built without CUDA; cannot copy to or from a CUDA device");
}
void zero_contiguous(const TensorView& v, Stream) {
  if (!v.device.is_cpu()) throw Unsupported("hk was built without CUDA; cannot zero device memory");
  std::memset(v.ptr(), 0, v.nbytes());
}
}  // namespace detail
#endif

}  // namespace hk
