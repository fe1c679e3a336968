// CUDA half of copy_view: a strided copy kernel (element sizes 1/2/4/8 bytes, rank ≤ 8) and the
// memcpy/memset wrappers. Contiguous same-device copies go through cudaMemcpyAsync.
#include "core/copy_internal.h"
#include "core/cuda_check.h"

namespace hk::detail {
namespace {

struct StridedLayout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t dst_strides[kMaxDims];
  int64_t src_strides[kMaxDims];
};

template <class T>
__global__ void strided_copy_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t n,
                                    StridedLayout layout) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, doff = 0, soff = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % layout.shape[d];
      rem /= layout.shape[d];
      doff += idx * layout.dst_strides[d];
      soff += idx * layout.src_strides[d];
    }
    dst[doff] = src[soff];
  }
}

template <class T>
void launch(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  StridedLayout layout{};
  layout.ndim = dst.ndim;
  for (int d = 0; d < dst.ndim; ++d) {
    layout.shape[d] = dst.shape[d];
    layout.dst_strides[d] = dst.strides[d];
    layout.src_strides[d] = src.strides[d];
  }
  const int64_t n = dst.numel();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535 * 8);
  strided_copy_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      static_cast<T*>(dst.ptr()), static_cast<const T*>(src.ptr()), n, layout);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cuda_strided_copy(const TensorView& dst, const TensorView& src, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream.handle);
  if (dst.is_contiguous() && src.is_contiguous()) {
    HK_CUDA_CHECK(cudaMemcpyAsync(dst.ptr(), src.ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  switch (dtype_size(dst.dtype)) {
    case 1: launch<uint8_t>(dst, src, s); break;
    case 2: launch<uint16_t>(dst, src, s); break;
    case 4: launch<uint32_t>(dst, src, s); break;
    case 8: launch<uint64_t>(dst, src, s); break;
    default: throw InvalidArgument("copy: unsupported element size");
  }
}

void cuda_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                 Stream stream) {
  auto s = static_cast<cudaStream_t>(stream.handle);
  cudaMemcpyKind kind = cudaMemcpyDefault;
  HK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (dst_device.is_cpu() || src_device.is_cpu()) HK_CUDA_CHECK(cudaStreamSynchronize(s));
}

void zero_contiguous(const TensorView& v, Stream stream) {
  if (v.device.is_cpu()) {
    std::memset(v.ptr(), 0, v.nbytes());
    return;
  }
  HK_CUDA_CHECK(cudaMemsetAsync(v.ptr(), 0, v.nbytes(), static_cast<cudaStream_t>(stream.handle)));
}

}  // namespace hk::detail
