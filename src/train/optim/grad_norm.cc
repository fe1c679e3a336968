// clip_grad_norm (hk/optim.h): the global L2 norm of all gradients and torch's clipping
// coefficient, as device scalars. CPU sums squares in double; CUDA runs the two-pass kernel of
// multi_tensor_cuda.cu. The gradients are not modified here: AdamW::step applies the coefficient.
#include <cmath>

#include "hk/error.h"
#include "hk/optim.h"
#include "ops/cpu_util.h"
#include "train/optim/grad_norm_cpu.h"
#ifdef HK_HAVE_CUDA
#include "train/optim/optim_cuda.h"
#endif

namespace hk::optim {

void detail::grad_norm_cpu(const std::vector<OptimTensor>& tensors, double max_norm, float* norm_out,
                           float* coef_out) {
  double sum = 0.0;
  for (const OptimTensor& t : tensors) {
    if (t.grad == nullptr || !t.grad->defined()) continue;
    const char* p = static_cast<const char*>(t.grad->view().ptr());
    const size_t es = dtype_size(t.grad->dtype());
    const int64_t n = t.grad->numel();
    for (int64_t i = 0; i < n; ++i) {
      const double g = ops::cpu::load_one<double>(p + i * es, t.grad->dtype());
      sum += g * g;
    }
  }
  const float norm = static_cast<float>(std::sqrt(sum));
  *norm_out = norm;
  // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1
  *coef_out = max_norm > 0 ? std::fmin(1.0f, static_cast<float>(max_norm) / (norm + 1e-6f)) : 1.0f;
}

GradNorm clip_grad_norm(const std::vector<OptimTensor>& tensors, double max_norm, Stream stream) {
  HK_CHECK(std::isfinite(max_norm), "clip_grad_norm: max_norm must be finite");
  Device device;
  bool any = false;
  for (const OptimTensor& t : tensors) {
    if (t.grad == nullptr || !t.grad->defined()) continue;
    HK_CHECK(t.grad->is_contiguous(), "clip_grad_norm: gradient of '" + t.name +
                                          "' is not contiguous (" + t.grad->view().str() + ")");
    if (!any) device = t.grad->device();
    HK_CHECK(t.grad->device() == device, "clip_grad_norm: gradients on " + device.str() + " and " +
                                             t.grad->device().str() +
                                             "; keep the model on one device");
    any = true;
  }
  GradNorm out;
  out.norm = Tensor::empty({1}, DType::F32, device, stream);
  out.clip_coef = Tensor::empty({1}, DType::F32, device, stream);
  if (device.is_cpu()) {
    detail::grad_norm_cpu(tensors, max_norm, out.norm.data_as<float>(),
                          out.clip_coef.data_as<float>());
    return out;
  }
#ifdef HK_HAVE_CUDA
  if (device.is_cuda()) {
    std::vector<cuda::TensorSlot> slots;
    for (const OptimTensor& t : tensors) {
      if (t.grad == nullptr || !t.grad->defined()) continue;
      cuda::TensorSlot s;
      s.grad = t.grad->view().ptr();
      s.grad_dtype = t.grad->dtype();
      s.numel = t.grad->numel();
      slots.push_back(s);
    }
    cuda::TensorTable table(device);
    table.update(std::move(slots), stream);
    Tensor partials =
        Tensor::empty({std::max<int64_t>(1, table.num_chunks())}, DType::F32, device, stream);
    cuda::grad_norm(table, partials.data_as<float>(), max_norm, out.norm.data_as<float>(),
                    out.clip_coef.data_as<float>(), stream);
    return out;
  }
#endif
  throw Unsupported("clip_grad_norm: no implementation for device " + device.str());
}

}  // namespace hk::optim
