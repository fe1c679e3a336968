// msda_cuda_library.cc — kernels-community/deformable-detr, cuda variant: the entry table and the
// ABI side (checks in msda_call.h, kernels in msda_cuda.cu). The backward of a 16-bit dvalue asks
// for an f32 accumulator as workspace; nothing else allocates, so the entry claims capture.
#include "msda_call.h"

namespace {

size_t workspace(const hk_call& call, uint32_t pass) {
  if (pass != HK_PASS_BACKWARD) return 0;
  const hk_tensor* dvalue = hk::sdk::optional_output(call, 0);
  if (!dvalue || dvalue->dtype == HK_DTYPE_F32) return 0;
  return static_cast<size_t>(hk::sdk::numel(*dvalue)) * sizeof(float);
}

void forward(const hk_call& call) {
  msda::Problem p = msda::problem_of(call, 0, HK_DEVICE_CUDA);
  p.out = msda::checked_bqc(hk::sdk::output(call, 0, "out"), "out", p, HK_DEVICE_CUDA);
  if (msda::forward_cuda(p, call.stream) != 0)
    hk::sdk::fail(HK_STATUS_DEVICE_ERROR, "MultiScaleDeformableAttention: the launch failed");
}

void backward(const hk_call& call) {
  msda::Problem p = msda::problem_of(call, 1, HK_DEVICE_CUDA);
  p.dout = msda::checked_bqc(hk::sdk::input(call, 0, "dout"), "dout", p, HK_DEVICE_CUDA);
  msda::backward_outputs(call, p, HK_DEVICE_CUDA);
  const size_t need = workspace(call, HK_PASS_BACKWARD);
  if (need > 0 && (call.workspace == nullptr || call.workspace_size < need))
    hk::sdk::fail(HK_STATUS_INVALID_ARGUMENT, "MultiScaleDeformableAttention backward needs " +
                                                  std::to_string(need) +
                                                  " bytes of workspace for a 16-bit dvalue, got " +
                                                  std::to_string(call.workspace_size));
  p.accumulator = static_cast<float*>(call.workspace);
  if (msda::backward_cuda(p, call.stream) != 0)
    hk::sdk::fail(HK_STATUS_DEVICE_ERROR,
                  "MultiScaleDeformableAttention backward: the launch failed");
}

const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "MultiScaleDeformableAttention",
    .interface = "multi_scale_deformable_attention",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING | HK_MODE_CAPTURE,
    .device = "cuda",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<forward>,
    .backward = hk::sdk::entry_point<backward>,
    .workspace_size = hk::sdk::workspace_point<workspace>,
})};

}  // namespace

HK_KERNEL_LIBRARY(kEntries)
