// Test kernel: an attention@1 entry (eager causal GQA attention, f32, cpu) published under an
// untrusted org, for attn_implementation tests (refused without allow_all_kernels, used with it).
#include <cmath>
#include <vector>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace {

const float* f32(const hk_tensor& t) {
  return reinterpret_cast<const float*>(static_cast<const char*>(t.data) + t.byte_offset);
}

void forward(const hk_call& call) {
  const hk_tensor& q = hk::sdk::input(call, 0, "q");
  const hk_tensor& k = hk::sdk::input(call, 1, "k");
  const hk_tensor& v = hk::sdk::input(call, 2, "v");
  const hk_tensor* key_start = hk::sdk::optional_input(call, 3);
  const hk_tensor& out = hk::sdk::output(call, 0, "out");
  if (q.dtype != HK_DTYPE_F32 || out.dtype != HK_DTYPE_F32)
    hk::sdk::fail(HK_STATUS_UNSUPPORTED, "cpu test attention handles f32 only");
  const auto* attrs = static_cast<const hk::AttentionAttrs*>(call.attrs);
  const int64_t B = q.shape[0], S = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t T = k.shape[1], Hkv = k.shape[2];
  const float scale = attrs->scale > 0 ? attrs->scale : 1.0f / std::sqrt(static_cast<float>(D));
  float* o = reinterpret_cast<float*>(static_cast<char*>(out.data) + out.byte_offset);
  std::vector<float> p(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t kvh = h / (Hq / Hkv);
        const int64_t start =
            key_start ? reinterpret_cast<const int32_t*>(static_cast<const char*>(key_start->data) +
                                                         key_start->byte_offset)[b]
                      : 0;
        const int64_t last = attrs->causal ? T - S + i : T - 1;
        float m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (j < start || j > last) {
            p[j] = -INFINITY;
            continue;
          }
          float s = 0;
          for (int64_t d = 0; d < D; ++d)
            s +=
                f32(q)[b * q.strides[0] + i * q.strides[1] + h * q.strides[2] + d * q.strides[3]] *
                f32(k)[b * k.strides[0] + j * k.strides[1] + kvh * k.strides[2] + d * k.strides[3]];
          p[j] = s * scale;
          m = std::fmax(m, p[j]);
        }
        for (int64_t j = 0; j < T; ++j) {
          p[j] = std::isinf(p[j]) ? 0.0f : std::exp(p[j] - m);
          sum += p[j];
        }
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0;
          for (int64_t j = 0; j < T; ++j)
            acc +=
                p[j] *
                f32(v)[b * v.strides[0] + j * v.strides[1] + kvh * v.strides[2] + d * v.strides[3]];
          o[b * out.strides[0] + i * out.strides[1] + h * out.strides[2] + d * out.strides[3]] =
              sum > 0 ? acc / sum : 0.0f;
        }
      }
}

}  // namespace

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "attention",
    .interface = "attention",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE,
    .device = "cpu",
    .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
    .forward = hk::sdk::entry_point<forward>,
})};

HK_KERNEL_LIBRARY(kEntries)
