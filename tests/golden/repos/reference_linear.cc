// Test kernel for the training golden tests: a linear@1 entry (kernels-community/test-linear) with
// forward and backward in plain f32 loops, so the Linear adapter's training path (dx, dweight,
// dbias, the accumulate flag) runs through the C ABI against Transformers' gradients. Contiguous
// f32 rows only (anything else: HK_STATUS_UNSUPPORTED). Not a kernel anyone should use.
#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace {

const float* cdata(const hk_tensor& t) {
  return reinterpret_cast<const float*>(static_cast<const char*>(t.data) + t.byte_offset);
}
float* mdata(const hk_tensor& t) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data) + t.byte_offset);
}
void need_f32_dense(const hk_tensor& t, const char* what) {
  int64_t stride = 0;
  if (t.dtype != HK_DTYPE_F32 || !hk::sdk::rows_dense(t, &stride) || stride != hk::sdk::last_dim(t))
    hk::sdk::fail(HK_STATUS_UNSUPPORTED,
                  std::string("test-linear: ") + what + " must be contiguous f32");
}

// y[r, n] = Σ_k x[r, k]·w[n, k] + b[n]
void forward(const hk_call& call) {
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& w = hk::sdk::input(call, 1, "weight");
  const hk_tensor* b = hk::sdk::optional_input(call, 2);
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  for (const hk_tensor* t : {&x, &w, &y}) need_f32_dense(*t, "x, weight and y");
  const int64_t rows = hk::sdk::rows(x), k = hk::sdk::last_dim(x), n = w.shape[0];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float s = b ? cdata(*b)[j] : 0.0f;
      for (int64_t i = 0; i < k; ++i) s += cdata(x)[r * k + i] * cdata(w)[j * k + i];
      mdata(y)[r * n + j] = s;
    }
}

// dx = dy·w; dweight (+)= dyᵀ·x; dbias (+)= Σ_rows dy
void backward(const hk_call& call) {
  const auto attrs = hk::sdk::read_attrs<hk::LinearAttrs>(call);
  const bool acc = (attrs.flags & hk::kAccumulateWeightGrads) != 0;
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  const hk_tensor& w = hk::sdk::input(call, 2, "weight");
  const hk_tensor* dx = hk::sdk::optional_output(call, 0);
  const hk_tensor* dw = hk::sdk::optional_output(call, 1);
  const hk_tensor* db = hk::sdk::optional_output(call, 2);
  for (const hk_tensor* t : {&dy, &x, &w}) need_f32_dense(*t, "dy, x and weight");
  const int64_t rows = hk::sdk::rows(x), k = hk::sdk::last_dim(x), n = w.shape[0];
  if (dx)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i) {
        float s = 0;
        for (int64_t j = 0; j < n; ++j) s += cdata(dy)[r * n + j] * cdata(w)[j * k + i];
        mdata(*dx)[r * k + i] = s;
      }
  if (dw)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < k; ++i) {
        float s = acc ? mdata(*dw)[j * k + i] : 0.0f;
        for (int64_t r = 0; r < rows; ++r) s += cdata(dy)[r * n + j] * cdata(x)[r * k + i];
        mdata(*dw)[j * k + i] = s;
      }
  if (db)
    for (int64_t j = 0; j < n; ++j) {
      float s = acc ? mdata(*db)[j] : 0.0f;
      for (int64_t r = 0; r < rows; ++r) s += cdata(dy)[r * n + j];
      mdata(*db)[j] = s;
    }
}

}  // namespace

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "Linear",
    .interface = "linear",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING,
    .device = "cpu",
    .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
    .forward = hk::sdk::entry_point<forward>,
    .backward = hk::sdk::entry_point<backward>,
})};

HK_KERNEL_LIBRARY(kEntries)
