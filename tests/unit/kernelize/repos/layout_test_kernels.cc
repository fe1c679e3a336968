// Test kernels with layouts (kernelize's stateful-kernel and fusion tests), f32 cpu, dense rows,
// forward and (where the entry trains) backward, plain loops in double accumulation:
//   stateful kernels (kernel_mapping):
//     ScaledRMSNorm      rms_norm@1, ScaledRMSNormLayout: "scale" renamed from "weight"      I T
//     TransposedLinear   linear@1, TransposedLinearLayout: "weight_t" = weightᵀ (no bias)    I T
//     GateUpMLP          mlp@1, GateUpMLPLayout: gate_up_proj.weight = [gate; up], down       I
//   fusions (KernelConfig fusions), names relative to the fused modules' parent:
//     RMSNormMLP         rms_norm_mlp@1: post_attention_layernorm.weight, mlp.gate_up_proj.weight,
//                        mlp.down_proj.weight                                                 I T
//     RMSNormMLPBias     the same with the MLP's biases (Llama mlp_bias)                       I
//     GateUpProj(Bias)   linear_group@1 over gate_proj, up_proj: gate_up_proj.weight (.bias)   I T
//     QKVProj(Bias), QKProj(Bias), KVProj(Bias)   linear_group@1 over the attention projections I T
//     QNormProj, KNormProj  linear_rms_norm@1 over q_proj → q_norm (k_proj → k_norm): the
//                        projection's weight and the norm weight renamed head_norm_weight      I
//     RMSNormMLPNoLayout rms_norm_mlp@1 without a layout (a fusion must refuse it)
// Entries that train have a backward; the others are inference only (training falls back).
#include <cmath>
#include <string>
#include <vector>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace {

const float* cf(const hk_tensor& t) {
  return reinterpret_cast<const float*>(static_cast<const char*>(t.data) + t.byte_offset);
}
float* mf(const hk_tensor& t) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data) + t.byte_offset);
}
void need_f32_dense(const hk_tensor& t, const char* what) {
  int64_t row_stride = 0;
  if (t.dtype != HK_DTYPE_F32 || !hk::sdk::rows_dense(t, &row_stride) ||
      row_stride != hk::sdk::last_dim(t))
    hk::sdk::fail(HK_STATUS_UNSUPPORTED,
                  std::string("test kernel: ") + what + " must be contiguous f32");
}
const hk_tensor* dense(const hk_tensor* t, const char* what) {
  if (t) need_f32_dense(*t, what);
  return t;
}
const hk_tensor& in(const hk_call& call, int i) {
  return *dense(&hk::sdk::input(call, i, "input"), "every input");
}
const hk_tensor* out(const hk_call& call, int i) {
  return dense(hk::sdk::optional_output(call, i), "every output");
}
using Vec = std::vector<float>;
// A weight gradient written, or added to under kAccumulateWeightGrads.
void put_grad(const hk_tensor* g, const Vec& v, uint32_t flags) {
  if (!g) return;
  float* p = mf(*g);
  for (size_t i = 0; i < v.size(); ++i)
    p[i] = (flags & hk::kAccumulateWeightGrads) ? p[i] + v[i] : v[i];
}

// y[r, n] = Σ_k x[r, k]·w[n, k] (+ b[n]); w row-major [N, K].
Vec matmul_nt(const float* x, const float* w, const float* b, int64_t rows, int64_t k, int64_t n) {
  Vec y(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = b ? b[j] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += double(x[r * k + i]) * w[j * k + i];
      y[static_cast<size_t>(r * n + j)] = static_cast<float>(acc);
    }
  return y;
}
// dx[r, k] (+)= Σ_n dy[r, n]·w[n, k]
void matmul_nn_add(const float* dy, const float* w, int64_t rows, int64_t n, int64_t k, float* dx) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += double(dy[r * n + j]) * w[j * k + i];
      dx[r * k + i] += static_cast<float>(acc);
    }
}
// dw[n, k] = Σ_r dy[r, n]·x[r, k]
Vec matmul_tn(const float* dy, const float* x, int64_t rows, int64_t n, int64_t k) {
  Vec dw(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) {
      double acc = 0;
      for (int64_t r = 0; r < rows; ++r) acc += double(dy[r * n + j]) * x[r * k + i];
      dw[static_cast<size_t>(j * k + i)] = static_cast<float>(acc);
    }
  return dw;
}
Vec col_sums(const float* dy, int64_t rows, int64_t n) {
  Vec db(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += dy[r * n + j];
    db[static_cast<size_t>(j)] = static_cast<float>(acc);
  }
  return db;
}

// RMSNorm over groups of `d` (the rows of x seen as [rows·h/d, d]); rstd per group.
Vec rms_norm(const float* x, const float* w, float eps, int64_t groups, int64_t d, Vec* rstd_out) {
  Vec y(static_cast<size_t>(groups * d));
  if (rstd_out) rstd_out->resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    double sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += double(x[g * d + j]) * x[g * d + j];
    const float r = static_cast<float>(1.0 / std::sqrt(sum / double(d) + eps));
    if (rstd_out) (*rstd_out)[static_cast<size_t>(g)] = r;
    for (int64_t j = 0; j < d; ++j) y[static_cast<size_t>(g * d + j)] = x[g * d + j] * r * w[j];
  }
  return y;
}
// dx, and dw (added to) of y = x·r·w.
void rms_norm_backward(const float* dy, const float* x, const float* w, float eps, int64_t groups,
                       int64_t d, float* dx, Vec& dw) {
  for (int64_t g = 0; g < groups; ++g) {
    double sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += double(x[g * d + j]) * x[g * d + j];
    const double r = 1.0 / std::sqrt(sum / double(d) + eps);
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) dot += double(dy[g * d + j]) * w[j] * x[g * d + j] * r;
    for (int64_t j = 0; j < d; ++j) {
      const double m = x[g * d + j] * r;
      dx[g * d + j] = static_cast<float>(r * (dy[g * d + j] * w[j] - m * dot / double(d)));
      dw[static_cast<size_t>(j)] += static_cast<float>(dy[g * d + j] * m);
    }
  }
}

float silu(float g) {
  return g / (1.0f + std::exp(-g));
}
float silu_grad(float g) {
  const float s = 1.0f / (1.0f + std::exp(-g));
  return s * (1.0f + g * (1.0f - s));
}

// ---- RMSNorm (stateful: "scale") ----------------------------------------------------------------
void scaled_rms_norm_forward(const hk_call& call) {
  const hk_tensor &x = in(call, 0), &scale = in(call, 1);
  const hk_tensor* y = out(call, 0);
  const auto attrs = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x);
  Vec rstd;
  const Vec n = rms_norm(cf(x), cf(scale), attrs.eps, rows, h, &rstd);
  std::copy(n.begin(), n.end(), mf(*y));
  if (const hk_tensor* r = out(call, 1)) std::copy(rstd.begin(), rstd.end(), mf(*r));
}
void scaled_rms_norm_backward(const hk_call& call) {
  const hk_tensor &dy = in(call, 0), &x = in(call, 1), &scale = in(call, 2);
  const auto attrs = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x);
  Vec dw(static_cast<size_t>(h));
  rms_norm_backward(cf(dy), cf(x), cf(scale), attrs.eps, rows, h, mf(*out(call, 0)), dw);
  put_grad(out(call, 1), dw, attrs.flags);
}

// ---- Linear (stateful: weight_t = weightᵀ)
// -------------------------------------------------------
void transposed_linear_forward(const hk_call& call) {
  const hk_tensor &x = in(call, 0), &wt = in(call, 1);  // wt [K, N]
  const int64_t k = wt.shape[0], n = wt.shape[1], rows = hk::sdk::rows(x);
  float* y = mf(*out(call, 0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += double(cf(x)[r * k + i]) * cf(wt)[i * n + j];
      y[r * n + j] = static_cast<float>(acc);
    }
}
void transposed_linear_backward(const hk_call& call) {
  const hk_tensor &dy = in(call, 0), &x = in(call, 1), &wt = in(call, 2);
  const auto attrs = hk::sdk::read_attrs<hk::LinearAttrs>(call);
  const int64_t k = wt.shape[0], n = wt.shape[1], rows = hk::sdk::rows(x);
  if (const hk_tensor* dx = out(call, 0))
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += double(cf(dy)[r * n + j]) * cf(wt)[i * n + j];
        mf(*dx)[r * k + i] = static_cast<float>(acc);
      }
  if (const hk_tensor* dwt = out(call, 1)) {  // dweight_t[i, j] = Σ_r x[r, i]·dy[r, j]
    Vec g(static_cast<size_t>(k * n));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t r = 0; r < rows; ++r) acc += double(cf(x)[r * k + i]) * cf(dy)[r * n + j];
        g[static_cast<size_t>(i * n + j)] = static_cast<float>(acc);
      }
    put_grad(dwt, g, attrs.flags);
  }
}

// ---- the gated MLP core shared by the MLP and the RMSNorm → MLP kernels ------------------------
struct MlpParams {
  const hk_tensor* gate_up;  // [2I, H]
  const hk_tensor* gate_up_bias = nullptr;
  const hk_tensor* down;  // [H, I]
  const hk_tensor* down_bias = nullptr;
};
Vec mlp_forward(const float* n, const MlpParams& p, int64_t rows, int64_t h) {
  const int64_t inter = p.gate_up->shape[0] / 2;
  const Vec gu = matmul_nt(n, cf(*p.gate_up), p.gate_up_bias ? cf(*p.gate_up_bias) : nullptr, rows,
                           h, 2 * inter);
  Vec a(static_cast<size_t>(rows * inter));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i)
      a[static_cast<size_t>(r * inter + i)] = silu(gu[static_cast<size_t>(r * 2 * inter + i)]) *
                                              gu[static_cast<size_t>(r * 2 * inter + inter + i)];
  return matmul_nt(a.data(), cf(*p.down), p.down_bias ? cf(*p.down_bias) : nullptr, rows, inter, h);
}
void need_silu(uint32_t activation) {
  if (activation != hk::kActivationSiLU)
    hk::sdk::fail(HK_STATUS_UNSUPPORTED, "test kernel: SiLU only");
}

void gate_up_mlp_forward(const hk_call& call) {
  const hk_tensor& x = in(call, 0);
  need_silu(hk::sdk::read_attrs<hk::MlpAttrs>(call).activation);
  MlpParams p{&in(call, 1), nullptr, &in(call, 2)};
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x);
  const Vec y = mlp_forward(cf(x), p, rows, h);
  std::copy(y.begin(), y.end(), mf(*out(call, 0)));
}

// rms_norm_mlp@1: x, norm weight, gate_up (, gate_up bias), down (, down bias).
MlpParams norm_mlp_params(const hk_call& call, int first, bool bias) {
  if (!bias) return {&in(call, first + 1), nullptr, &in(call, first + 2)};
  return {&in(call, first + 1), &in(call, first + 2), &in(call, first + 3), &in(call, first + 4)};
}
template <bool kBias>
void rms_norm_mlp_forward(const hk_call& call) {
  const hk_tensor &x = in(call, 0), &norm_w = in(call, 1);
  const auto attrs = hk::sdk::read_attrs<hk::RmsNormMlpAttrs>(call);
  need_silu(attrs.activation);
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x);
  Vec rstd;
  const Vec n = rms_norm(cf(x), cf(norm_w), attrs.eps, rows, h, &rstd);
  const Vec y = mlp_forward(n.data(), norm_mlp_params(call, 1, kBias), rows, h);
  std::copy(y.begin(), y.end(), mf(*out(call, 0)));
  if (const hk_tensor* r = out(call, 1)) std::copy(rstd.begin(), rstd.end(), mf(*r));
}
// backward: dy, x, norm_w, gate_up, down, rstd? → dx, dnorm_w?, dgate_up?, ddown?
void rms_norm_mlp_backward(const hk_call& call) {
  const hk_tensor &dy = in(call, 0), &x = in(call, 1), &norm_w = in(call, 2);
  const MlpParams p = norm_mlp_params(call, 2, false);
  const auto attrs = hk::sdk::read_attrs<hk::RmsNormMlpAttrs>(call);
  need_silu(attrs.activation);
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x), inter = p.gate_up->shape[0] / 2;
  const Vec n = rms_norm(cf(x), cf(norm_w), attrs.eps, rows, h, nullptr);
  const Vec gu = matmul_nt(n.data(), cf(*p.gate_up), nullptr, rows, h, 2 * inter);
  Vec a(static_cast<size_t>(rows * inter));
  Vec dgu(static_cast<size_t>(rows * 2 * inter));
  Vec dh(static_cast<size_t>(rows * inter), 0.0f);
  matmul_nn_add(cf(dy), cf(*p.down), rows, h, inter, dh.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const size_t gi = static_cast<size_t>(r * 2 * inter + i), ui = gi + inter;
      const size_t ai = static_cast<size_t>(r * inter + i);
      a[ai] = silu(gu[gi]) * gu[ui];
      dgu[gi] = dh[ai] * gu[ui] * silu_grad(gu[gi]);
      dgu[ui] = dh[ai] * silu(gu[gi]);
    }
  Vec dn(static_cast<size_t>(rows * h), 0.0f);
  matmul_nn_add(dgu.data(), cf(*p.gate_up), rows, 2 * inter, h, dn.data());
  Vec dnorm(static_cast<size_t>(h), 0.0f);
  rms_norm_backward(dn.data(), cf(x), cf(norm_w), attrs.eps, rows, h, mf(*out(call, 0)), dnorm);
  put_grad(out(call, 1), dnorm, attrs.flags);
  if (const hk_tensor* g = out(call, 2))
    put_grad(g, matmul_tn(dgu.data(), n.data(), rows, 2 * inter, h), attrs.flags);
  if (const hk_tensor* g = out(call, 3))
    put_grad(g, matmul_tn(cf(dy), a.data(), rows, h, inter), attrs.flags);
}

// ---- linear_group@1: x, weight [ΣN, K] (, bias [ΣN]) → y_1 .. y_n
// --------------------------------
template <bool kBias>
void linear_group_forward(const hk_call& call) {
  const hk_tensor &x = in(call, 0), &w = in(call, 1);
  const float* b = kBias ? cf(in(call, 2)) : nullptr;
  const int64_t k = hk::sdk::last_dim(x), rows = hk::sdk::rows(x), total = w.shape[0];
  const Vec y = matmul_nt(cf(x), cf(w), b, rows, k, total);
  int64_t col = 0;
  for (int32_t o = 0; o < call.num_outputs; ++o) {
    const hk_tensor* yo = out(call, o);
    const int64_t n = hk::sdk::last_dim(*yo);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j)
        mf(*yo)[r * n + j] = y[static_cast<size_t>(r * total + col + j)];
    col += n;
  }
  if (col != total) hk::sdk::fail(HK_STATUS_INVALID_ARGUMENT, "outputs do not cover the weight");
}
// backward: dy_1..dy_n, x, weight (, bias) → dx?, dweight? (, dbias?)
template <bool kBias>
void linear_group_backward(const hk_call& call) {
  const auto attrs = hk::sdk::read_attrs<hk::LinearGroupAttrs>(call);
  const int n_out = static_cast<int>(attrs.num_members);
  const hk_tensor &x = in(call, n_out), &w = in(call, n_out + 1);
  const int64_t k = hk::sdk::last_dim(x), rows = hk::sdk::rows(x), total = w.shape[0];
  Vec dy(static_cast<size_t>(rows * total));  // [dy_1 ... dy_n] side by side
  int64_t col = 0;
  for (int o = 0; o < n_out; ++o) {
    const hk_tensor& d = in(call, o);
    const int64_t n = hk::sdk::last_dim(d);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j)
        dy[static_cast<size_t>(r * total + col + j)] = cf(d)[r * n + j];
    col += n;
  }
  if (const hk_tensor* dx = out(call, 0)) {
    std::fill(mf(*dx), mf(*dx) + rows * k, 0.0f);
    matmul_nn_add(dy.data(), cf(w), rows, total, k, mf(*dx));
  }
  put_grad(out(call, 1), matmul_tn(dy.data(), cf(x), rows, total, k), attrs.flags);
  if (kBias) put_grad(out(call, 2), col_sums(dy.data(), rows, total), attrs.flags);
}

// ---- linear_rms_norm@1: x, weight [N, K], norm weight [D] → RMSNorm_D(x·Wᵀ)
// -----------------------
void linear_rms_norm_forward(const hk_call& call) {
  const hk_tensor &x = in(call, 0), &w = in(call, 1), &norm_w = in(call, 2);
  const auto attrs = hk::sdk::read_attrs<hk::LinearRmsNormAttrs>(call);
  const int64_t k = hk::sdk::last_dim(x), rows = hk::sdk::rows(x), n = w.shape[0];
  const int64_t d = attrs.norm_dim;
  if (d <= 0 || n % d != 0 || norm_w.shape[0] != d)
    hk::sdk::fail(HK_STATUS_INVALID_ARGUMENT, "norm_dim does not divide the projection");
  const Vec p = matmul_nt(cf(x), cf(w), nullptr, rows, k, n);
  const Vec y = rms_norm(p.data(), cf(norm_w), attrs.eps, rows * n / d, d, nullptr);
  std::copy(y.begin(), y.end(), mf(*out(call, 0)));
}

void unsupported_forward(const hk_call&) {
  hk::sdk::fail(HK_STATUS_UNSUPPORTED, "not meant to run");
}

// ---- layouts -----------------------------------------------------------------------------------

const char* const kScaleParameters[] = {"scale"};
const char* const kScaleSources[] = {"weight"};
const hk_conversion kScaleConversions[] = {{"scale", kScaleSources, 1, HK_CONVERT_RENAME, 0}};
const hk_layout kScaledRMSNormLayout = {"ScaledRMSNormLayout", kScaleParameters, 1,
                                        kScaleConversions, 1};

const char* const kWeightTParameters[] = {"weight_t"};
const char* const kWeightSources[] = {"weight"};
const hk_conversion kWeightTConversions[] = {
    {"weight_t", kWeightSources, 1, HK_CONVERT_TRANSPOSE, 0}};
const hk_layout kTransposedLinearLayout = {"TransposedLinearLayout", kWeightTParameters, 1,
                                           kWeightTConversions, 1};

const char* const kGateUpMlpParameters[] = {"gate_up_proj.weight", "down_proj.weight"};
const char* const kGateUpSources[] = {"gate_proj.weight", "up_proj.weight"};
const hk_conversion kGateUpMlpConversions[] = {
    {"gate_up_proj.weight", kGateUpSources, 2, HK_CONVERT_CONCAT, 0}};
const hk_layout kGateUpMLPLayout = {"GateUpMLPLayout", kGateUpMlpParameters, 2,
                                    kGateUpMlpConversions, 1};

const char* const kNormMlpParameters[] = {"post_attention_layernorm.weight",
                                          "mlp.gate_up_proj.weight", "mlp.down_proj.weight"};
const char* const kNormGateUpSources[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
const hk_conversion kNormMlpConversions[] = {
    {"mlp.gate_up_proj.weight", kNormGateUpSources, 2, HK_CONVERT_CONCAT, 0}};
const hk_layout kRMSNormMLPLayout = {"RMSNormMLPLayout", kNormMlpParameters, 3, kNormMlpConversions,
                                     1};

const char* const kNormMlpBiasParameters[] = {"post_attention_layernorm.weight",
                                              "mlp.gate_up_proj.weight", "mlp.gate_up_proj.bias",
                                              "mlp.down_proj.weight", "mlp.down_proj.bias"};
const char* const kNormGateUpBiasSources[] = {"mlp.gate_proj.bias", "mlp.up_proj.bias"};
const hk_conversion kNormMlpBiasConversions[] = {
    {"mlp.gate_up_proj.weight", kNormGateUpSources, 2, HK_CONVERT_CONCAT, 0},
    {"mlp.gate_up_proj.bias", kNormGateUpBiasSources, 2, HK_CONVERT_CONCAT, 0}};
const hk_layout kRMSNormMLPBiasLayout = {"RMSNormMLPBiasLayout", kNormMlpBiasParameters, 5,
                                         kNormMlpBiasConversions, 2};

// linear_group layouts: <fused>.weight (and .bias) = the members' concatenated along dim 0.
#define GROUP_LAYOUT(Name, fused, ...)                                                       \
  const char* const Name##Params[] = {fused ".weight"};                                      \
  const char* const Name##ParamsBias[] = {fused ".weight", fused ".bias"};                   \
  const char* const Name##W[] = {__VA_ARGS__};                                               \
  const hk_conversion Name##Conv[] = {                                                       \
      {fused ".weight", Name##W, sizeof(Name##W) / sizeof(*Name##W), HK_CONVERT_CONCAT, 0}}; \
  const hk_layout Name##Layout = {#Name "Layout", Name##Params, 1, Name##Conv, 1};

GROUP_LAYOUT(GateUpProj, "gate_up_proj", "gate_proj.weight", "up_proj.weight")
GROUP_LAYOUT(QKVProj, "qkv_proj", "q_proj.weight", "k_proj.weight", "v_proj.weight")
GROUP_LAYOUT(QKProj, "qk_proj", "q_proj.weight", "k_proj.weight")
GROUP_LAYOUT(KVProj, "kv_proj", "k_proj.weight", "v_proj.weight")

#define GROUP_BIAS_LAYOUT(Name, fused, ...)                                                 \
  const char* const Name##B[] = {__VA_ARGS__};                                              \
  const hk_conversion Name##BiasConv[] = {                                                  \
      {fused ".weight", Name##W, sizeof(Name##W) / sizeof(*Name##W), HK_CONVERT_CONCAT, 0}, \
      {fused ".bias", Name##B, sizeof(Name##B) / sizeof(*Name##B), HK_CONVERT_CONCAT, 0}};  \
  const hk_layout Name##BiasLayout = {#Name "BiasLayout", Name##ParamsBias, 2, Name##BiasConv, 2};

GROUP_BIAS_LAYOUT(GateUpProj, "gate_up_proj", "gate_proj.bias", "up_proj.bias")
GROUP_BIAS_LAYOUT(QKVProj, "qkv_proj", "q_proj.bias", "k_proj.bias", "v_proj.bias")
GROUP_BIAS_LAYOUT(QKProj, "qk_proj", "q_proj.bias", "k_proj.bias")
GROUP_BIAS_LAYOUT(KVProj, "kv_proj", "k_proj.bias", "v_proj.bias")

const char* const kQNormParameters[] = {"q_proj.weight", "q_proj.head_norm_weight"};
const char* const kQNormSources[] = {"q_norm.weight"};
const hk_conversion kQNormConversions[] = {
    {"q_proj.head_norm_weight", kQNormSources, 1, HK_CONVERT_RENAME, 0}};
const hk_layout kQNormProjLayout = {"QNormProjLayout", kQNormParameters, 2, kQNormConversions, 1};
const char* const kKNormParameters[] = {"k_proj.weight", "k_proj.head_norm_weight"};
const char* const kKNormSources[] = {"k_norm.weight"};
const hk_conversion kKNormConversions[] = {
    {"k_proj.head_norm_weight", kKNormSources, 1, HK_CONVERT_RENAME, 0}};
const hk_layout kKNormProjLayout = {"KNormProjLayout", kKNormParameters, 2, kKNormConversions, 1};

constexpr uint32_t kF32 = HK_DTYPE_BIT(HK_DTYPE_F32);
constexpr uint32_t kIT = HK_MODE_INFERENCE | HK_MODE_TRAINING;

hk_kernel_entry entry(const char* name, const char* interface, uint32_t modes, hk_kernel_fn fwd,
                      hk_kernel_fn bwd, const hk_layout* layout) {
  return hk::sdk::make_entry({.name = name,
                              .interface = interface,
                              .interface_version = 1,
                              .modes = modes,
                              .device = "cpu",
                              .dtypes = kF32,
                              .forward = fwd,
                              .backward = bwd,
                              .layout = layout});
}

template <void (*F)(const hk_call&)>
constexpr hk_kernel_fn ep = hk::sdk::entry_point<F>;

}  // namespace

static const hk_kernel_entry kEntries[] = {
    entry("ScaledRMSNorm", "rms_norm", kIT, ep<scaled_rms_norm_forward>,
          ep<scaled_rms_norm_backward>, &kScaledRMSNormLayout),
    entry("TransposedLinear", "linear", kIT, ep<transposed_linear_forward>,
          ep<transposed_linear_backward>, &kTransposedLinearLayout),
    entry("GateUpMLP", "mlp", HK_MODE_INFERENCE, ep<gate_up_mlp_forward>, nullptr,
          &kGateUpMLPLayout),
    entry("RMSNormMLP", "rms_norm_mlp", kIT, ep<rms_norm_mlp_forward<false>>,
          ep<rms_norm_mlp_backward>, &kRMSNormMLPLayout),
    entry("RMSNormMLPBias", "rms_norm_mlp", HK_MODE_INFERENCE, ep<rms_norm_mlp_forward<true>>,
          nullptr, &kRMSNormMLPBiasLayout),
    entry("GateUpProj", "linear_group", kIT, ep<linear_group_forward<false>>,
          ep<linear_group_backward<false>>, &GateUpProjLayout),
    entry("QKVProj", "linear_group", kIT, ep<linear_group_forward<false>>,
          ep<linear_group_backward<false>>, &QKVProjLayout),
    entry("QKProj", "linear_group", kIT, ep<linear_group_forward<false>>,
          ep<linear_group_backward<false>>, &QKProjLayout),
    entry("KVProj", "linear_group", kIT, ep<linear_group_forward<false>>,
          ep<linear_group_backward<false>>, &KVProjLayout),
    entry("GateUpProjBias", "linear_group", kIT, ep<linear_group_forward<true>>,
          ep<linear_group_backward<true>>, &GateUpProjBiasLayout),
    entry("QKVProjBias", "linear_group", kIT, ep<linear_group_forward<true>>,
          ep<linear_group_backward<true>>, &QKVProjBiasLayout),
    entry("QKProjBias", "linear_group", kIT, ep<linear_group_forward<true>>,
          ep<linear_group_backward<true>>, &QKProjBiasLayout),
    entry("KVProjBias", "linear_group", kIT, ep<linear_group_forward<true>>,
          ep<linear_group_backward<true>>, &KVProjBiasLayout),
    entry("QNormProj", "linear_rms_norm", HK_MODE_INFERENCE, ep<linear_rms_norm_forward>, nullptr,
          &kQNormProjLayout),
    entry("KNormProj", "linear_rms_norm", HK_MODE_INFERENCE, ep<linear_rms_norm_forward>, nullptr,
          &kKNormProjLayout),
    entry("RMSNormMLPNoLayout", "rms_norm_mlp", HK_MODE_INFERENCE, ep<unsupported_forward>, nullptr,
          nullptr),
};

HK_KERNEL_LIBRARY(kEntries)
