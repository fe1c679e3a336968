// tests/kernels/liger_kernels_cuda_test.cc — the cuda variant of the liger kernels against the
// double references (shared cases in liger_cases.inc). Label gpu: needs a CUDA device. Each
// launcher runs on the default stream and is followed by a synchronisation and a check of both
// its return code and the device's last error, so a fault names the kernel that caused it.
#include <cuda_runtime.h>

#include <vector>

#include "liger/cuda_ops.h"
#include "liger_reference.h"
#include "liger_test_support.h"

namespace liger_test {
void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes + 64) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
    std::abort();
  }
  return p;  // freed at exit (tests are short)
}
void dev_upload(void* dst, const void* src, size_t bytes) {
  ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
}
void dev_download(void* dst, const void* src, size_t bytes) {
  ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}
}  // namespace liger_test

namespace be {
#define LIGER_CHECKED(name, call)                                             \
  do {                                                                        \
    const int rc = (call);                                                    \
    const cudaError_t sync = cudaDeviceSynchronize();                         \
    ASSERT_EQ(rc, 0) << name << " returned " << rc;                           \
    ASSERT_EQ(sync, cudaSuccess) << name << ": " << cudaGetErrorString(sync); \
  } while (0)

void* workspace(size_t bytes) {
  return bytes ? liger_test::dev_alloc(bytes) : nullptr;
}
size_t rms_bwd_workspace(int64_t r, int64_t c) {
  return liger::cuda::rms_norm_bwd_workspace_bytes(r, c);
}
size_t ln_bwd_workspace(int64_t r, int64_t c) {
  return liger::cuda::layer_norm_bwd_workspace_bytes(r, c);
}
size_t ce_workspace(int64_t n) {
  return liger::cuda::cross_entropy_workspace_bytes(n);
}
size_t flce_workspace(int64_t n, int64_t h, int64_t v, liger::Dt dt, int64_t chunk) {
  return liger::cuda::fused_linear_cross_entropy_workspace_bytes(n, h, v, liger::Dt::F32, dt,
                                                                 chunk);
}
size_t mlp_workspace(int64_t r, int64_t i, liger::Dt dt, bool bwd, bool saved) {
  return liger::cuda::mlp_workspace_bytes(r, i, dt, bwd, saved);
}
void mlp_fwd(const liger::MlpArgs& a) {
  LIGER_CHECKED("mlp_fwd", liger::cuda::mlp_fwd(a, nullptr));
}
void mlp_bwd(const liger::MlpArgs& a) {
  LIGER_CHECKED("mlp_bwd", liger::cuda::mlp_bwd(a, nullptr));
}
void rms_norm_fwd(const liger::RmsNormFwd& a) {
  LIGER_CHECKED("rms_norm_fwd", liger::cuda::rms_norm_fwd(a, nullptr));
}
void rms_norm_bwd(const liger::RmsNormBwd& a) {
  LIGER_CHECKED("rms_norm_bwd", liger::cuda::rms_norm_bwd(a, nullptr));
}
void layer_norm_fwd(const liger::LayerNormFwd& a) {
  LIGER_CHECKED("layer_norm_fwd", liger::cuda::layer_norm_fwd(a, nullptr));
}
void layer_norm_bwd(const liger::LayerNormBwd& a) {
  LIGER_CHECKED("layer_norm_bwd", liger::cuda::layer_norm_bwd(a, nullptr));
}
void rope(const liger::RopeArgs& a) {
  LIGER_CHECKED("rope", liger::cuda::rope(a, nullptr));
}
void unary_act_fwd(const liger::UnaryAct& a) {
  LIGER_CHECKED("unary_act_fwd", liger::cuda::unary_act_fwd(a, nullptr));
}
void unary_act_bwd(const liger::UnaryAct& a) {
  LIGER_CHECKED("unary_act_bwd", liger::cuda::unary_act_bwd(a, nullptr));
}
void gated_act_fwd(const liger::GatedAct& a) {
  LIGER_CHECKED("gated_act_fwd", liger::cuda::gated_act_fwd(a, nullptr));
}
void gated_act_bwd(const liger::GatedAct& a) {
  LIGER_CHECKED("gated_act_bwd", liger::cuda::gated_act_bwd(a, nullptr));
}
void cross_entropy_fwd(const liger::CrossEntropyArgs& a) {
  LIGER_CHECKED("cross_entropy_fwd", liger::cuda::cross_entropy_fwd(a, nullptr));
}
void cross_entropy_scale(const liger::CrossEntropyScale& a) {
  LIGER_CHECKED("cross_entropy_scale", liger::cuda::cross_entropy_scale(a, nullptr));
}
void flce_fwd(const liger::FusedLinearCrossEntropyArgs& a) {
  LIGER_CHECKED("fused_linear_cross_entropy_fwd",
                liger::cuda::fused_linear_cross_entropy_fwd(a, nullptr));
}
void shift_labels(const void* l, liger::IndexDt dt, int64_t b, int64_t s, int64_t bs, int64_t ig,
                  int64_t* out) {
  LIGER_CHECKED("shift_labels", liger::cuda::shift_labels(l, dt, b, s, bs, ig, out, nullptr));
}
}  // namespace be

#include "liger_cases.inc"
