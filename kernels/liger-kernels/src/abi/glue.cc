// abi/glue.cc — hk_call → liger argument structs, for one variant (see abi/glue.h). Compiled
// with LIGER_CUDA=0 into liger_core_cpu and LIGER_CUDA=1 into liger_core_cuda.
//
// Validation is complete before any work is queued: device type, dtypes, shapes, the row layout
// (last dim contiguous, one row stride — anything else is HK_STATUS_UNSUPPORTED so the caller
// makes it contiguous or falls back), and the workspace size. Errors name the entry's interface and
// the offending tensor.
#include <string>
#include <vector>

#include "abi/glue.h"
#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"
#include "liger/args.h"

#if LIGER_CUDA
#include "liger/cuda_ops.h"
#define LIGER_NS cuda
#else
#include "liger/cpu_ops.h"
#define LIGER_NS cpu
#endif

namespace liger_abi::LIGER_NS {
namespace {

using hk::sdk::fail;
using liger::Dt;
using liger::IndexDt;
using liger::Rows;

#if LIGER_CUDA
constexpr int32_t kDevice = HK_DEVICE_CUDA;
constexpr const char* kDeviceName = "cuda";
#else
constexpr int32_t kDevice = HK_DEVICE_CPU;
constexpr const char* kDeviceName = "cpu";
#endif

std::string shape_of(const hk_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

void check_device(const hk_tensor& t, const char* what) {
  if (t.device_type != kDevice)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " is not on a " + kDeviceName +
                                         " device; this variant only runs " + kDeviceName +
                                         " tensors");
}

Dt float_dt(const hk_tensor& t, const char* what) {
  if (t.dtype == HK_DTYPE_F32) return Dt::F32;
  if (t.dtype == HK_DTYPE_BF16) return Dt::BF16;
  if (t.dtype == HK_DTYPE_F16) return Dt::F16;
  fail(HK_STATUS_UNSUPPORTED,
       std::string(what) + " has dtype " +
           (hk::sdk::dtype_code_name(t.dtype) ? hk::sdk::dtype_code_name(t.dtype) : "?") +
           "; liger kernels compute in f32, bf16 or f16");
}

void* base(const hk_tensor& t) {
  return static_cast<char*>(t.data) + t.byte_offset;
}

// A matrix view of t: leading dims flattened, last dim contiguous, one row stride.
Rows rows_of(const hk_tensor& t, const char* what) {
  check_device(t, what);
  Rows r;
  r.dt = float_dt(t, what);
  r.cols = hk::sdk::last_dim(t);
  r.rows = hk::sdk::rows(t);
  if (!hk::sdk::rows_dense(t, &r.row_stride))
    fail(HK_STATUS_UNSUPPORTED, std::string(what) + " " + shape_of(t) +
                                    " is not laid out as rows with a contiguous last dimension; "
                                    "make it contiguous first");
  r.data = base(t);
  return r;
}

liger::Vec vec_of(const hk_tensor& t, int64_t n, const char* what) {
  check_device(t, what);
  if (hk::sdk::numel(t) != n || (t.ndim > 0 && n > 1 && t.strides[t.ndim - 1] != 1) || t.ndim > 1)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " must be a contiguous vector of " +
                                         std::to_string(n) + " elements, got " + shape_of(t));
  return liger::Vec{base(t), float_dt(t, what)};
}

float* f32_of(const hk_tensor* t, int64_t n, const char* what) {
  if (!t) return nullptr;
  check_device(*t, what);
  if (t->dtype != HK_DTYPE_F32 || hk::sdk::numel(*t) != n)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " must be f32 with " + std::to_string(n) +
                                         " elements, got " + shape_of(*t));
  if (n > 1 && t->ndim > 0 && t->strides[t->ndim - 1] != 1)
    fail(HK_STATUS_UNSUPPORTED, std::string(what) + " must be contiguous");
  return static_cast<float*>(base(*t));
}

struct Labels {
  const void* data;
  IndexDt dt;
  int64_t stride;
};
Labels labels_of(const hk_tensor& t, int64_t n, const char* what) {
  check_device(t, what);
  if (t.dtype != HK_DTYPE_I32 && t.dtype != HK_DTYPE_I64)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " must be i32 or i64");
  if (hk::sdk::numel(t) != n)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " " + shape_of(t) + " must have " +
                                         std::to_string(n) + " elements (one per row)");
  // One dimension of size n (others 1): its stride is the label stride.
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i)
    if (t.shape[i] != 1) {
      stride = t.strides[i];
      break;
    }
  for (int i = 0, seen = 0; i < t.ndim; ++i)
    if (t.shape[i] != 1 && ++seen > 1)
      fail(HK_STATUS_UNSUPPORTED, std::string(what) + " must be one-dimensional (or [1, n])");
  return {base(t), t.dtype == HK_DTYPE_I32 ? IndexDt::I32 : IndexDt::I64, stride};
}

void same_shape(const hk_tensor& a, const hk_tensor& b, const char* an, const char* bn) {
  if (!hk::sdk::same_shape(a, b))
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(an) + " " + shape_of(a) + " and " + bn + " " +
                                         shape_of(b) + " must have the same shape");
}

void check_workspace(const hk_call& call, size_t need, const char* op) {
  if (need > 0 && (call.workspace == nullptr || call.workspace_size < need))
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(op) + " needs " + std::to_string(need) +
                                         " bytes of workspace (see workspace_size), got " +
                                         std::to_string(call.workspace_size));
}

#if LIGER_CUDA
void run(int rc, const char* op) {
  if (rc > 0) fail(HK_STATUS_DEVICE_ERROR, std::string(op) + ": CUDA error " + std::to_string(rc));
  if (rc < 0)
    fail(HK_STATUS_DEVICE_ERROR, std::string(op) + ": cuBLASLt status " + std::to_string(-rc));
}
#define LIGER_RUN(fn, args, call) run(liger::cuda::fn(args, (call).stream), #fn)
#else
#define LIGER_RUN(fn, args, call) liger::cpu::fn(args)
#endif

liger::Reduction reduction_of(uint32_t r) {
  if (r > hk::kReductionSum)
    fail(HK_STATUS_INVALID_ARGUMENT, "unknown reduction " + std::to_string(r));
  return r == hk::kReductionNone  ? liger::Reduction::None
         : r == hk::kReductionSum ? liger::Reduction::Sum
                                  : liger::Reduction::Mean;
}

// ---- rms_norm@1 ---------------------------------------------------------------------------------
// hk's kRmsNormCasting* codes and liger::CastMode share their numbering (0 llama, 1 gemma, 2 none).
static_assert(static_cast<uint32_t>(liger::CastMode::Llama) == hk::kRmsNormCastingLlama &&
              static_cast<uint32_t>(liger::CastMode::Gemma) == hk::kRmsNormCastingGemma &&
              static_cast<uint32_t>(liger::CastMode::None) == hk::kRmsNormCastingNone);
liger::CastMode cast_mode(uint32_t m) {
  if (m > hk::kRmsNormCastingNone)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "rms_norm: unknown casting_mode " + std::to_string(m) + " (0 llama, 1 gemma, 2 none)");
  return static_cast<liger::CastMode>(m);
}

void rms_fwd(const hk_call& call) {
  const auto at = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  same_shape(x, y, "x", "y");
  liger::RmsNormFwd a;
  a.x = rows_of(x, "x"), a.y = rows_of(y, "y");
  if (a.y.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "rms_norm: y must have x's dtype");
  a.w = vec_of(hk::sdk::input(call, 1, "weight"), a.x.cols, "weight");
  a.rstd = f32_of(hk::sdk::optional_output(call, 1), a.x.rows, "rstd");
  a.eps = at.eps, a.offset = at.offset, a.mode = cast_mode(at.casting_mode);
  if (a.x.rows * a.x.cols == 0) return;
  LIGER_RUN(rms_norm_fwd, a, call);
}

size_t rms_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  if (pass != HK_PASS_BACKWARD) return 0;
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  return liger::cuda::rms_norm_bwd_workspace_bytes(hk::sdk::rows(x), hk::sdk::last_dim(x));
#else
  (void)call, (void)pass;
  return 0;
#endif
}

void rms_bwd(const hk_call& call) {
  const auto at = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  const hk_tensor& dx = hk::sdk::output(call, 0, "dx");
  same_shape(dy, x, "dy", "x");
  same_shape(dx, x, "dx", "x");
  liger::RmsNormBwd a;
  a.dy = rows_of(dy, "dy"), a.x = rows_of(x, "x"), a.dx = rows_of(dx, "dx");
  if (a.dy.dt != a.x.dt || a.dx.dt != a.x.dt)
    fail(HK_STATUS_UNSUPPORTED, "rms_norm backward: dy, x and dx must share one dtype");
  a.w = vec_of(hk::sdk::input(call, 2, "weight"), a.x.cols, "weight");
  a.rstd = f32_of(hk::sdk::optional_input(call, 3), a.x.rows, "rstd");
  if (const hk_tensor* dw = hk::sdk::optional_output(call, 1))
    a.dw = vec_of(*dw, a.x.cols, "dweight");
  a.accumulate_dw = (at.flags & hk::kAccumulateWeightGrads) != 0;
  a.eps = at.eps, a.offset = at.offset, a.mode = cast_mode(at.casting_mode);
  check_workspace(call, rms_ws(call, HK_PASS_BACKWARD), "rms_norm backward");
  a.workspace = call.workspace;
  if (a.x.cols == 0) return;
  LIGER_RUN(rms_norm_bwd, a, call);
}

// ---- layer_norm@1 -------------------------------------------------------------------------------
void ln_fwd(const hk_call& call) {
  const auto at = hk::sdk::read_attrs<hk::LayerNormAttrs>(call);
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  same_shape(x, y, "x", "y");
  liger::LayerNormFwd a;
  a.x = rows_of(x, "x"), a.y = rows_of(y, "y");
  if (a.y.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "layer_norm: y must have x's dtype");
  a.w = vec_of(hk::sdk::input(call, 1, "weight"), a.x.cols, "weight");
  if (const hk_tensor* b = hk::sdk::optional_input(call, 2)) a.b = vec_of(*b, a.x.cols, "bias");
  a.mean = f32_of(hk::sdk::optional_output(call, 1), a.x.rows, "mean");
  a.rstd = f32_of(hk::sdk::optional_output(call, 2), a.x.rows, "rstd");
  a.eps = at.eps;
  if (a.x.rows * a.x.cols == 0) return;
  LIGER_RUN(layer_norm_fwd, a, call);
}

size_t ln_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  if (pass != HK_PASS_BACKWARD) return 0;
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  return liger::cuda::layer_norm_bwd_workspace_bytes(hk::sdk::rows(x), hk::sdk::last_dim(x));
#else
  (void)call, (void)pass;
  return 0;
#endif
}

void ln_bwd(const hk_call& call) {
  const auto at = hk::sdk::read_attrs<hk::LayerNormAttrs>(call);
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  const hk_tensor& dx = hk::sdk::output(call, 0, "dx");
  same_shape(dy, x, "dy", "x");
  same_shape(dx, x, "dx", "x");
  liger::LayerNormBwd a;
  a.dy = rows_of(dy, "dy"), a.x = rows_of(x, "x"), a.dx = rows_of(dx, "dx");
  if (a.dy.dt != a.x.dt || a.dx.dt != a.x.dt)
    fail(HK_STATUS_UNSUPPORTED, "layer_norm backward: dy, x and dx must share one dtype");
  a.w = vec_of(hk::sdk::input(call, 2, "weight"), a.x.cols, "weight");
  a.mean = f32_of(hk::sdk::optional_input(call, 3), a.x.rows, "mean");
  a.rstd = f32_of(hk::sdk::optional_input(call, 4), a.x.rows, "rstd");
  if (const hk_tensor* t = hk::sdk::optional_output(call, 1))
    a.dw = vec_of(*t, a.x.cols, "dweight");
  if (const hk_tensor* t = hk::sdk::optional_output(call, 2)) a.db = vec_of(*t, a.x.cols, "dbias");
  a.accumulate = (at.flags & hk::kAccumulateWeightGrads) != 0;
  a.eps = at.eps;
  check_workspace(call, ln_ws(call, HK_PASS_BACKWARD), "layer_norm backward");
  a.workspace = call.workspace;
  if (a.x.cols == 0) return;
  LIGER_RUN(layer_norm_bwd, a, call);
}

// ---- rotary_pos_emb@1 ---------------------------------------------------------------------------
void rope_tensor(const hk_tensor& in, const hk_tensor& out, const char* name, int64_t b, int64_t s,
                 int64_t d, Dt dt, liger::RopeTensor* t) {
  check_device(in, name);
  check_device(out, name);
  if (in.ndim != 4 || in.shape[0] != b || in.shape[1] != s || in.shape[3] != d)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string("rotary_pos_emb: ") + name + " " + shape_of(in) +
                                         " must be [B, S, heads, D] with B, S, D of q");
  same_shape(in, out, name, "its output");
  if (float_dt(in, name) != dt || float_dt(out, name) != dt)
    fail(HK_STATUS_UNSUPPORTED, "rotary_pos_emb: q, k and outputs must share one dtype");
  if ((d > 1 && (in.strides[3] != 1 || out.strides[3] != 1)))
    fail(HK_STATUS_UNSUPPORTED,
         std::string("rotary_pos_emb: ") + name + " must have a contiguous head dimension");
  t->x = base(in), t->y = base(out), t->heads = in.shape[2];
  for (int i = 0; i < 3; ++i) t->x_strides[i] = in.strides[i], t->y_strides[i] = out.strides[i];
}

// forward: (q, k, cos, sin) → (q_out, k_out); backward: (dq_out, dk_out, cos, sin) → (dq, dk).
void rope_call(const hk_call& call, bool backward) {
  const auto at = hk::sdk::read_attrs<hk::RotaryAttrs>(call);
  const hk_tensor& q = hk::sdk::input(call, 0, "q");
  const hk_tensor* k = hk::sdk::optional_input(call, 1);
  const hk_tensor& cs = hk::sdk::input(call, 2, "cos");
  const hk_tensor& sn = hk::sdk::input(call, 3, "sin");
  if (q.ndim != 4)
    fail(HK_STATUS_INVALID_ARGUMENT, "rotary_pos_emb: q must be [B, S, Hq, D], got " + shape_of(q));
  liger::RopeArgs a;
  a.batch = q.shape[0], a.seq = q.shape[1], a.head_dim = q.shape[3];
  a.dt = float_dt(q, "q");
  if (at.rotary_dim != 0 && at.rotary_dim != a.head_dim)
    fail(HK_STATUS_UNSUPPORTED, "rotary_pos_emb: partial rotary (rotary_dim " +
                                    std::to_string(at.rotary_dim) + " of " +
                                    std::to_string(a.head_dim) + ") is not implemented here");
  if (a.head_dim % 2 != 0)
    fail(HK_STATUS_INVALID_ARGUMENT, "rotary_pos_emb: head_dim must be even");
  rope_tensor(q, hk::sdk::output(call, 0, "q_out"), "q", a.batch, a.seq, a.head_dim, a.dt, &a.q);
  if (k)
    rope_tensor(*k, hk::sdk::output(call, 1, "k_out"), "k", a.batch, a.seq, a.head_dim, a.dt, &a.k);
  // cos/sin [B|1, S, D]: rows of D contiguous, S rows per batch, batch stride in rows.
  check_device(cs, "cos");
  check_device(sn, "sin");
  same_shape(cs, sn, "cos", "sin");
  const int64_t cb = cs.ndim == 3 ? cs.shape[0] : 1;
  if (cs.ndim < 2 || cs.ndim > 3 || cs.shape[cs.ndim - 1] != a.head_dim ||
      cs.shape[cs.ndim - 2] != a.seq || (cb != 1 && cb != a.batch))
    fail(HK_STATUS_INVALID_ARGUMENT,
         "rotary_pos_emb: cos " + shape_of(cs) + " must be [B|1, S, D]");
  for (const hk_tensor* t : {&cs, &sn})
    if (t->strides[t->ndim - 1] != 1 || t->strides[t->ndim - 2] != a.head_dim ||
        (t->ndim == 3 && cb > 1 && t->strides[0] % a.head_dim != 0) ||
        t->strides[0] != cs.strides[0])
      fail(HK_STATUS_UNSUPPORTED, "rotary_pos_emb: cos/sin must be contiguous [B|1, S, D]");
  a.cos_dt = float_dt(cs, "cos");
  if (float_dt(sn, "sin") != a.cos_dt || (a.cos_dt != Dt::F32 && a.cos_dt != a.dt))
    fail(HK_STATUS_UNSUPPORTED, "rotary_pos_emb: cos/sin must be f32 or q's dtype");
  a.cos = base(cs), a.sin = base(sn);
  a.cos_batch_stride = cs.ndim == 3 && cb > 1 ? cs.strides[0] / a.head_dim : 0;
  a.backward = backward;
  LIGER_RUN(rope, a, call);
}

// ---- silu@1
// ---------------------------------------------------------------------------------------
// silu@1 and activation@1 share this: y = act(x), dx = dy·act'(x).
void unary_act_call(const hk_call& call, bool backward, liger::Act act, const char* name) {
  liger::UnaryAct a;
  a.act = act;
  if (!backward) {
    const hk_tensor& x = hk::sdk::input(call, 0, "x");
    const hk_tensor& y = hk::sdk::output(call, 0, "y");
    same_shape(x, y, "x", "y");
    a.x = rows_of(x, "x"), a.y = rows_of(y, "y");
    if (a.x.dt != a.y.dt)
      fail(HK_STATUS_UNSUPPORTED, std::string(name) + ": y must have x's dtype");
    LIGER_RUN(unary_act_fwd, a, call);
  } else {
    const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
    const hk_tensor& x = hk::sdk::input(call, 1, "x");
    const hk_tensor& dx = hk::sdk::output(call, 0, "dx");
    same_shape(dy, x, "dy", "x");
    same_shape(dx, x, "dx", "x");
    a.dy = rows_of(dy, "dy"), a.x = rows_of(x, "x"), a.dx = rows_of(dx, "dx");
    if (a.x.dt != a.dy.dt || a.x.dt != a.dx.dt)
      fail(HK_STATUS_UNSUPPORTED,
           std::string(name) + " backward: dy, x and dx must share one dtype");
    LIGER_RUN(unary_act_bwd, a, call);
  }
}

void silu_call(const hk_call& call, bool backward) {
  unary_act_call(call, backward, liger::Act::SiLU, "silu");
}

// ---- activation@1 / act_and_mul@1 (kernels-community/activation) -------------------------------
// Each entry computes one fixed function; attrs.kind, when given, must name it (a mismatch is a
// caller bug that would otherwise silently compute something else).
uint32_t act_kind_code(liger::Act act) {
  switch (act) {
    case liger::Act::SiLU:
      return hk::kActivationSiLU;
    case liger::Act::GeluErf:
      return hk::kActivationGELU;
    case liger::Act::GeluTanh:
      return hk::kActivationGELUTanh;
    case liger::Act::QuickGelu:
      return hk::kActivationQuickGELU;
  }
  return hk::kActivationSiLU;
}

void check_kind(const hk_call& call, liger::Act act, const char* name) {
  if (call.attrs && call.attrs_size >= sizeof(uint32_t)) {
    const uint32_t kind = *static_cast<const uint32_t*>(call.attrs);
    if (kind != act_kind_code(act))
      fail(HK_STATUS_INVALID_ARGUMENT, std::string(name) + " computes activation kind " +
                                           std::to_string(act_kind_code(act)) +
                                           " but attrs.kind is " + std::to_string(kind));
  }
}

// x [..., 2d] as two row views gate = x[..., :d], up = x[..., d:].
void split_halves(const liger::Rows& x, liger::Rows& first, liger::Rows& second, const char* what) {
  if (x.cols % 2 != 0)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) +
                                         " must have an even last dimension "
                                         "(gate ‖ up), got " +
                                         std::to_string(x.cols));
  first = x;
  first.cols = x.cols / 2;
  second = first;
  second.data =
      static_cast<char*>(x.data) + first.cols * static_cast<int64_t>(liger::dt_size(x.dt));
}

void act_and_mul_call(const hk_call& call, bool backward, liger::Act act, const char* name) {
  check_kind(call, act, name);
  liger::GatedAct a;
  a.act = act;
  const int xi = backward ? 1 : 0;
  const hk_tensor& x = hk::sdk::input(call, xi, "x");
  const hk_tensor* up = hk::sdk::optional_input(call, xi + 1);
  if (up) {
    a.gate = rows_of(x, "gate"), a.up = rows_of(*up, "up");
  } else {
    split_halves(rows_of(x, "x"), a.gate, a.up, "x");
  }
  if (a.gate.dt != a.up.dt || a.gate.rows != a.up.rows || a.gate.cols != a.up.cols)
    fail(HK_STATUS_INVALID_ARGUMENT,
         std::string(name) + ": gate and up must match in shape and dtype");
  if (!backward) {
    a.out = rows_of(hk::sdk::output(call, 0, "y"), "y");
    if (a.out.rows != a.gate.rows || a.out.cols != a.gate.cols || a.out.dt != a.gate.dt)
      fail(HK_STATUS_INVALID_ARGUMENT, std::string(name) + ": y must be [..., d] in x's dtype");
    LIGER_RUN(gated_act_fwd, a, call);
  } else {
    a.dout = rows_of(hk::sdk::input(call, 0, "dy"), "dy");
    const liger::Rows dx = rows_of(hk::sdk::output(call, 0, "dx"), "dx");
    if (up) {
      a.dgate = dx;
      a.dup = rows_of(hk::sdk::output(call, 1, "dup"), "dup");
    } else {
      split_halves(dx, a.dgate, a.dup, "dx");
    }
    if (a.dout.rows != a.gate.rows || a.dout.cols != a.gate.cols || a.dgate.cols != a.gate.cols ||
        a.dgate.rows != a.gate.rows)
      fail(HK_STATUS_INVALID_ARGUMENT, std::string(name) + " backward: dy, dx shapes do not match");
    LIGER_RUN(gated_act_bwd, a, call);
  }
}

// ---- mlp@1 --------------------------------------------------------------------------------------
liger::Act mlp_act(uint32_t a) {
  if (a == hk::kActivationSiLU) return liger::Act::SiLU;
  if (a == hk::kActivationGELU) return liger::Act::GeluErf;
  if (a == hk::kActivationGELUTanh) return liger::Act::GeluTanh;
  fail(HK_STATUS_UNSUPPORTED, "mlp: unknown activation " + std::to_string(a));
}

// Fills x and the three weights (inputs first..first+3) and checks their shapes.
void mlp_common(const hk_call& call, int first, liger::MlpArgs* a) {
  const auto at = hk::sdk::read_attrs<hk::MlpAttrs>(call);
  a->act = mlp_act(at.activation);
  a->accumulate = (at.flags & hk::kAccumulateWeightGrads) != 0;
  a->x = rows_of(hk::sdk::input(call, first, "x"), "x");
  a->gate_w = rows_of(hk::sdk::input(call, first + 1, "gate_w"), "gate_w");
  a->up_w = rows_of(hk::sdk::input(call, first + 2, "up_w"), "up_w");
  a->down_w = rows_of(hk::sdk::input(call, first + 3, "down_w"), "down_w");
  const int64_t h = a->x.cols, inter = a->gate_w.rows;
  if (a->gate_w.cols != h || a->up_w.rows != inter || a->up_w.cols != h || a->down_w.rows != h ||
      a->down_w.cols != inter)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "mlp: weights must be gate_w/up_w [I, H] and down_w [H, I] for x [..., H]");
  for (const Rows* w : {&a->gate_w, &a->up_w, &a->down_w})
    if (w->dt != a->x.dt) fail(HK_STATUS_UNSUPPORTED, "mlp: weights must have x's dtype");
}

// The saved pre-activations: forward outputs 1, 2 or backward inputs 5, 6 (both or neither).
const hk_tensor* mlp_saved(const hk_call& call, bool backward, int which) {
  return backward ? hk::sdk::optional_input(call, 5 + which)
                  : hk::sdk::optional_output(call, 1 + which);
}

size_t mlp_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  const bool bwd = pass == HK_PASS_BACKWARD;
  const hk_tensor& x = hk::sdk::input(call, bwd ? 1 : 0, "x");
  const hk_tensor& gw = hk::sdk::input(call, bwd ? 2 : 1, "gate_w");
  return liger::cuda::mlp_workspace_bytes(hk::sdk::rows(x), gw.ndim > 0 ? gw.shape[0] : 0,
                                          float_dt(x, "x"), bwd,
                                          mlp_saved(call, bwd, 0) != nullptr);
#else
  (void)call, (void)pass;
  return 0;
#endif
}

// Fills a->gate / a->up from the call's saved pre-activations, checked against x and gate_w.
void mlp_gate_up(const hk_call& call, bool backward, liger::MlpArgs* a) {
  const hk_tensor* g = mlp_saved(call, backward, 0);
  const hk_tensor* u = mlp_saved(call, backward, 1);
  if (!g && !u) return;
  if (!g || !u)
    fail(HK_STATUS_INVALID_ARGUMENT, "mlp: gate and up are given together or not at all");
  a->gate = rows_of(*g, "gate"), a->up = rows_of(*u, "up");
  for (const Rows* r : {&a->gate, &a->up})
    if (r->rows != a->x.rows || r->cols != a->gate_w.rows || r->dt != a->x.dt)
      fail(HK_STATUS_INVALID_ARGUMENT,
           "mlp: gate and up must be [..., I] in x's dtype, one row per row of x");
}

void mlp_fwd_call(const hk_call& call) {
  liger::MlpArgs a;
  mlp_common(call, 0, &a);
  mlp_gate_up(call, false, &a);
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  same_shape(y, hk::sdk::input(call, 0, "x"), "y", "x");
  a.y = rows_of(y, "y");
  if (a.y.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "mlp: y must have x's dtype");
  check_workspace(call, mlp_ws(call, HK_PASS_FORWARD), "mlp");
  a.workspace = call.workspace;
  LIGER_RUN(mlp_fwd, a, call);
}

void mlp_bwd_call(const hk_call& call) {
  liger::MlpArgs a;
  mlp_common(call, 1, &a);
  mlp_gate_up(call, true, &a);
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  const hk_tensor& dx = hk::sdk::output(call, 0, "dx");
  same_shape(dy, x, "dy", "x");
  same_shape(dx, x, "dx", "x");
  a.dy = rows_of(dy, "dy"), a.dx = rows_of(dx, "dx");
  if (a.dy.dt != a.x.dt || a.dx.dt != a.x.dt)
    fail(HK_STATUS_UNSUPPORTED, "mlp backward: dy, x and dx must share one dtype");
  const Rows* ws[3] = {&a.gate_w, &a.up_w, &a.down_w};
  Rows* gs[3] = {&a.dgate_w, &a.dup_w, &a.ddown_w};
  const char* names[3] = {"dgate_w", "dup_w", "ddown_w"};
  for (int i = 0; i < 3; ++i)
    if (const hk_tensor* t = hk::sdk::optional_output(call, 1 + i)) {
      *gs[i] = rows_of(*t, names[i]);
      if (gs[i]->rows != ws[i]->rows || gs[i]->cols != ws[i]->cols)
        fail(HK_STATUS_INVALID_ARGUMENT,
             std::string("mlp backward: ") + names[i] + " must be shaped like its weight");
    }
  check_workspace(call, mlp_ws(call, HK_PASS_BACKWARD), "mlp backward");
  a.workspace = call.workspace;
  LIGER_RUN(mlp_bwd, a, call);
}

// ---- rms_norm_mlp@1 (RMSNorm → gated MLP fused)
// -------------------------------------------------- Inputs after the activations: the layout's
// parameters — the norm's weight [H], gate_up [2I, H] (gate rows first), down [H, I]
// (LigerRMSNormSwiGLUMLPLayout, liger_table.inc).
void rms_mlp_common(const hk_call& call, int first, liger::RmsNormMlpArgs* a) {
  const auto at = hk::sdk::read_attrs<hk::RmsNormMlpAttrs>(call);
  a->act = mlp_act(at.activation);
  a->eps = at.eps;
  a->accumulate = (at.flags & hk::kAccumulateWeightGrads) != 0;
  a->x = rows_of(hk::sdk::input(call, first, "x"), "x");
  a->norm_w = vec_of(hk::sdk::input(call, first + 1, "norm weight"), a->x.cols, "norm weight");
  a->gate_up_w = rows_of(hk::sdk::input(call, first + 2, "gate_up_w"), "gate_up_w");
  a->down_w = rows_of(hk::sdk::input(call, first + 3, "down_w"), "down_w");
  const int64_t h = a->x.cols, inter = a->down_w.cols;
  if (a->gate_up_w.rows != 2 * inter || a->gate_up_w.cols != h || a->down_w.rows != h)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "rms_norm_mlp: weights must be gate_up_w [2I, H] and down_w [H, I] for x [..., H]");
  for (const Rows* w : {&a->gate_up_w, &a->down_w})
    if (w->dt != a->x.dt) fail(HK_STATUS_UNSUPPORTED, "rms_norm_mlp: weights must have x's dtype");
}

// The kept pre-activations gu [rows, 2I] in x's dtype: forward output 2 / backward input 6.
void rms_mlp_gate_up(const hk_tensor* t, liger::RmsNormMlpArgs* a) {
  if (!t) return;
  a->gate_up = rows_of(*t, "gate_up");
  if (a->gate_up.rows != a->x.rows || a->gate_up.cols != a->gate_up_w.rows ||
      a->gate_up.dt != a->x.dt)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "rms_norm_mlp: gate_up must be [rows, 2I] in x's dtype, one row per row of x");
}

size_t rms_mlp_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  const bool bwd = pass == HK_PASS_BACKWARD;
  const hk_tensor& x = hk::sdk::input(call, bwd ? 1 : 0, "x");
  const hk_tensor& down = hk::sdk::input(call, bwd ? 4 : 3, "down_w");
  return liger::cuda::rms_norm_mlp_workspace_bytes(hk::sdk::rows(x), hk::sdk::last_dim(x),
                                                   hk::sdk::last_dim(down), float_dt(x, "x"), bwd);
#else
  (void)call, (void)pass;
  return 0;
#endif
}

void rms_mlp_fwd_call(const hk_call& call) {
  liger::RmsNormMlpArgs a;
  rms_mlp_common(call, 0, &a);
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  same_shape(y, hk::sdk::input(call, 0, "x"), "y", "x");
  a.y = rows_of(y, "y");
  if (a.y.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "rms_norm_mlp: y must have x's dtype");
  a.rstd = f32_of(hk::sdk::optional_output(call, 1), a.x.rows, "rstd");
  rms_mlp_gate_up(hk::sdk::optional_output(call, 2), &a);
  check_workspace(call, rms_mlp_ws(call, HK_PASS_FORWARD), "rms_norm_mlp");
  a.workspace = call.workspace;
  if (a.x.cols == 0) return;
  LIGER_RUN(rms_norm_mlp_fwd, a, call);
}

// The forward's rstd (input 5) is not read: backward recomputes the norm's output anyway, and
// rstd with it. The forward's gate_up (input 6), when given, is read and overwritten.
void rms_mlp_bwd_call(const hk_call& call) {
  liger::RmsNormMlpArgs a;
  rms_mlp_common(call, 1, &a);
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  const hk_tensor& dx = hk::sdk::output(call, 0, "dx");
  same_shape(dy, x, "dy", "x");
  same_shape(dx, x, "dx", "x");
  a.dy = rows_of(dy, "dy"), a.dx = rows_of(dx, "dx");
  if (a.dy.dt != a.x.dt || a.dx.dt != a.x.dt)
    fail(HK_STATUS_UNSUPPORTED, "rms_norm_mlp backward: dy, x and dx must share one dtype");
  rms_mlp_gate_up(hk::sdk::optional_input(call, 6), &a);
  if (const hk_tensor* t = hk::sdk::optional_output(call, 1))
    a.dnorm_w = vec_of(*t, a.x.cols, "dnorm_w");
  const Rows* ws[2] = {&a.gate_up_w, &a.down_w};
  Rows* gs[2] = {&a.dgate_up_w, &a.ddown_w};
  const char* names[2] = {"dgate_up_w", "ddown_w"};
  for (int i = 0; i < 2; ++i)
    if (const hk_tensor* t = hk::sdk::optional_output(call, 2 + i)) {
      *gs[i] = rows_of(*t, names[i]);
      if (gs[i]->rows != ws[i]->rows || gs[i]->cols != ws[i]->cols)
        fail(HK_STATUS_INVALID_ARGUMENT,
             std::string("rms_norm_mlp backward: ") + names[i] + " must be shaped like its weight");
    }
  check_workspace(call, rms_mlp_ws(call, HK_PASS_BACKWARD), "rms_norm_mlp backward");
  a.workspace = call.workspace;
  if (a.x.cols == 0) return;
  LIGER_RUN(rms_norm_mlp_bwd, a, call);
}

// ---- linear@1 -----------------------------------------------------------------------------------
size_t linear_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  (void)call, (void)pass;
  return liger::cuda::linear_workspace_bytes();
#else
  (void)call, (void)pass;
  return 0;
#endif
}

// x [..., K] (input `x_index`) and weight [N, K] (input `x_index` + 1).
void linear_common(const hk_call& call, int x_index, liger::LinearArgs* a) {
  a->accumulate =
      (hk::sdk::read_attrs<hk::LinearAttrs>(call).flags & hk::kAccumulateWeightGrads) != 0;
  a->x = rows_of(hk::sdk::input(call, x_index, "x"), "x");
  a->w = rows_of(hk::sdk::input(call, x_index + 1, "weight"), "weight");
  if (hk::sdk::input(call, x_index + 1, "weight").ndim != 2 || a->w.cols != a->x.cols)
    fail(HK_STATUS_INVALID_ARGUMENT, "linear: weight must be [N, K] for x [..., K]");
  if (a->w.dt != a->x.dt) fail(HK_STATUS_UNSUPPORTED, "linear: weight must have x's dtype");
}

// [..., K] → [..., N]: the same leading dims, last dim n.
void check_linear_out(const hk_tensor& out, const hk_tensor& in, int64_t n, const char* what) {
  bool ok = out.ndim == in.ndim && out.ndim > 0 && out.shape[out.ndim - 1] == n;
  for (int i = 0; ok && i + 1 < in.ndim; ++i) ok = out.shape[i] == in.shape[i];
  if (!ok)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string("linear: ") + what + " " + shape_of(out) +
                                         " must be x's leading dims by " + std::to_string(n));
}

void linear_fwd_call(const hk_call& call) {
  liger::LinearArgs a;
  linear_common(call, 0, &a);
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  check_linear_out(y, hk::sdk::input(call, 0, "x"), a.w.rows, "y");
  a.y = rows_of(y, "y");
  if (a.y.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "linear: y must have x's dtype");
  if (const hk_tensor* b = hk::sdk::optional_input(call, 2)) a.b = vec_of(*b, a.w.rows, "bias");
  check_workspace(call, linear_ws(call, HK_PASS_FORWARD), "linear");
  a.workspace = call.workspace;
  LIGER_RUN(linear_fwd, a, call);
}

void linear_bwd_call(const hk_call& call) {
  liger::LinearArgs a;
  linear_common(call, 1, &a);
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  check_linear_out(dy, hk::sdk::input(call, 1, "x"), a.w.rows, "dy");
  a.dy = rows_of(dy, "dy");
  if (a.dy.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "linear backward: dy must have x's dtype");
  if (const hk_tensor* dx = hk::sdk::optional_output(call, 0)) {
    same_shape(*dx, hk::sdk::input(call, 1, "x"), "dx", "x");
    a.dx = rows_of(*dx, "dx");
    if (a.dx.dt != a.x.dt) fail(HK_STATUS_UNSUPPORTED, "linear backward: dx must have x's dtype");
  }
  if (const hk_tensor* dw = hk::sdk::optional_output(call, 1)) {
    a.dw = rows_of(*dw, "dweight");
    if (dw->ndim != 2 || a.dw.rows != a.w.rows || a.dw.cols != a.w.cols)
      fail(HK_STATUS_INVALID_ARGUMENT, "linear backward: dweight must be shaped like weight");
  }
  if (const hk_tensor* db = hk::sdk::optional_output(call, 2))
    a.db = vec_of(*db, a.w.rows, "dbias");
  check_workspace(call, linear_ws(call, HK_PASS_BACKWARD), "linear backward");
  a.workspace = call.workspace;
  LIGER_RUN(linear_bwd, a, call);
}

// ---- cross_entropy@1 ----------------------------------------------------------------------------
void ce_attrs(const hk::CrossEntropyAttrs& at, liger::CrossEntropyArgs* a) {
  a->ignore_index = at.ignore_index, a->label_smoothing = at.label_smoothing;
  a->z_loss_scale = at.lse_square_scale, a->softcap = at.softcap;
  a->reduction = reduction_of(at.reduction);
  if (!(at.label_smoothing >= 0 && at.label_smoothing <= 1))
    fail(HK_STATUS_INVALID_ARGUMENT, "cross_entropy: label_smoothing must be in [0, 1]");
  if (at.softcap < 0) fail(HK_STATUS_INVALID_ARGUMENT, "cross_entropy: softcap must be ≥ 0");
}

size_t ce_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  const hk_tensor& logits = hk::sdk::input(call, pass == HK_PASS_BACKWARD ? 1 : 0, "logits");
  return liger::cuda::cross_entropy_workspace_bytes(hk::sdk::rows(logits));
#else
  (void)call, (void)pass;
  return 0;
#endif
}

void ce_common(const hk_call& call, const hk_tensor& logits, const hk_tensor& labels,
               liger::CrossEntropyArgs* a) {
  ce_attrs(hk::sdk::read_attrs<hk::CrossEntropyAttrs>(call), a);
  if (logits.ndim != 2)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "cross_entropy: logits must be [N, V], got " + shape_of(logits));
  a->logits = rows_of(logits, "logits");
  const Labels l = labels_of(labels, a->logits.rows, "labels");
  a->labels = l.data, a->labels_dt = l.dt, a->labels_stride = l.stride;
}

float* loss_out(const hk_tensor* t, liger::Reduction red, int64_t n, const char* what) {
  return f32_of(t, red == liger::Reduction::None ? n : 1, what);
}

void ce_fwd(const hk_call& call) {
  liger::CrossEntropyArgs a;
  ce_common(call, hk::sdk::input(call, 0, "logits"), hk::sdk::input(call, 1, "labels"), &a);
  const int64_t n = a.logits.rows;
  a.loss = loss_out(&hk::sdk::output(call, 0, "loss"), a.reduction, n, "loss");
  a.lse = f32_of(hk::sdk::optional_output(call, 1), n, "lse");
  a.z_loss = loss_out(hk::sdk::optional_output(call, 2), a.reduction, n, "z_loss");
  if (const hk_tensor* g = hk::sdk::optional_output(call, 3)) {  // the in-forward gradient
    same_shape(*g, hk::sdk::input(call, 0, "logits"), "dlogits", "logits");
    a.dlogits = rows_of(*g, "dlogits");
    if (a.dlogits.dt != a.logits.dt)
      fail(HK_STATUS_UNSUPPORTED, "cross_entropy: dlogits must have logits' dtype");
  }
  check_workspace(call, ce_ws(call, HK_PASS_FORWARD), "cross_entropy");
  a.workspace = call.workspace;
  LIGER_RUN(cross_entropy_fwd, a, call);
}

void ce_bwd(const hk_call& call) {
  liger::CrossEntropyArgs a;
  const hk_tensor& logits = hk::sdk::input(call, 1, "logits");
  ce_common(call, logits, hk::sdk::input(call, 2, "labels"), &a);
  const int64_t n = a.logits.rows;
  a.dloss = loss_out(&hk::sdk::input(call, 0, "dloss"), a.reduction, n, "dloss");
  a.lse_in = f32_of(hk::sdk::optional_input(call, 3), n, "lse");
  const hk_tensor& g = hk::sdk::output(call, 0, "dlogits");
  same_shape(g, logits, "dlogits", "logits");
  a.dlogits = rows_of(g, "dlogits");
  if (a.dlogits.dt != a.logits.dt)
    fail(HK_STATUS_UNSUPPORTED, "cross_entropy: dlogits must have logits' dtype");
  check_workspace(call, ce_ws(call, HK_PASS_BACKWARD), "cross_entropy backward");
  a.workspace = call.workspace;
  LIGER_RUN(cross_entropy_fwd, a, call);
}

// ---- fused_linear_cross_entropy@1 ---------------------------------------------------------------
// forward (x, weight, labels, bias?) → (loss, dx?, dweight?, dbias?): the gradients for dloss = 1
// in the same pass; backward (dloss, x, weight, labels, bias?) → (dx, dweight?, dbias?) recomputes
// the chunks with the upstream dloss. bias and dbias are refused (HK_STATUS_UNSUPPORTED).
void flce_args(const hk_call& call, int first, liger::FusedLinearCrossEntropyArgs* a) {
  const auto at = hk::sdk::read_attrs<hk::FusedLinearCrossEntropyAttrs>(call);
  const hk_tensor& x = hk::sdk::input(call, first, "x");
  const hk_tensor& w = hk::sdk::input(call, first + 1, "weight");
  if (hk::sdk::optional_input(call, first + 3))
    fail(HK_STATUS_UNSUPPORTED, "fused_linear_cross_entropy: a bias is not implemented here");
  if (x.ndim != 2 || w.ndim != 2 || x.shape[1] != w.shape[1])
    fail(HK_STATUS_INVALID_ARGUMENT, "fused_linear_cross_entropy: x " + shape_of(x) +
                                         " and weight " + shape_of(w) +
                                         " must be [N, H] and [V, H]");
  a->hidden = rows_of(x, "x"), a->weight = rows_of(w, "weight");
  if (a->hidden.dt != a->weight.dt)
    fail(HK_STATUS_UNSUPPORTED, "fused_linear_cross_entropy: x and weight must share one dtype");
  const Labels l = labels_of(hk::sdk::input(call, first + 2, "labels"), a->hidden.rows, "labels");
  a->labels = l.data, a->labels_dt = l.dt, a->labels_stride = l.stride;
  liger::CrossEntropyArgs ce;
  ce_attrs(at.ce, &ce);
  a->ignore_index = ce.ignore_index, a->label_smoothing = ce.label_smoothing;
  a->z_loss_scale = ce.z_loss_scale, a->softcap = ce.softcap, a->reduction = ce.reduction;
  a->accumulate_dweight = (at.flags & hk::kAccumulateWeightGrads) != 0;
}

void flce_grads(const hk_call& call, int dx_index, liger::FusedLinearCrossEntropyArgs* a) {
  if (const hk_tensor* dx = hk::sdk::optional_output(call, dx_index)) {
    if (dx->ndim != 2 || dx->shape[0] != a->hidden.rows || dx->shape[1] != a->hidden.cols)
      fail(HK_STATUS_INVALID_ARGUMENT, "fused_linear_cross_entropy: dx must be shaped like x");
    a->dhidden = rows_of(*dx, "dx");
    if (a->dhidden.dt != a->hidden.dt)
      fail(HK_STATUS_UNSUPPORTED, "fused_linear_cross_entropy: dx must have x's dtype");
  }
  if (const hk_tensor* dw = hk::sdk::optional_output(call, dx_index + 1)) {
    if (dw->ndim != 2 || dw->shape[0] != a->weight.rows || dw->shape[1] != a->weight.cols)
      fail(HK_STATUS_INVALID_ARGUMENT,
           "fused_linear_cross_entropy: dweight must be shaped like weight");
    a->dweight = rows_of(*dw, "dweight");
    if (a->dweight.dt != Dt::F32 && a->dweight.row_stride != a->dweight.cols)
      fail(HK_STATUS_UNSUPPORTED,
           "fused_linear_cross_entropy: a 16-bit dweight must be contiguous");
  }
  if (hk::sdk::optional_output(call, dx_index + 2))
    fail(HK_STATUS_UNSUPPORTED, "fused_linear_cross_entropy: dbias is not implemented here");
}

size_t flce_ws(const hk_call& call, uint32_t pass) {
#if LIGER_CUDA
  const int first = pass == HK_PASS_BACKWARD ? 1 : 0;
  const hk_tensor& x = hk::sdk::input(call, first, "x");
  const hk_tensor& w = hk::sdk::input(call, first + 1, "weight");
  const hk_tensor* dw = hk::sdk::optional_output(call, pass == HK_PASS_BACKWARD ? 1 : 2);
  const Dt wdt = dw ? float_dt(*dw, "dweight") : Dt::F32;
  return liger::cuda::fused_linear_cross_entropy_workspace_bytes(
      hk::sdk::rows(x), hk::sdk::last_dim(x), w.ndim > 0 ? w.shape[0] : 0, float_dt(x, "x"), wdt,
      0);
#else
  (void)call, (void)pass;
  return 0;
#endif
}

void flce_fwd(const hk_call& call) {
  liger::FusedLinearCrossEntropyArgs a;
  flce_args(call, 0, &a);
  a.loss = loss_out(&hk::sdk::output(call, 0, "loss"), a.reduction, a.hidden.rows, "loss");
  flce_grads(call, 1, &a);
  check_workspace(call, flce_ws(call, HK_PASS_FORWARD), "fused_linear_cross_entropy");
  a.workspace = call.workspace;
  LIGER_RUN(fused_linear_cross_entropy_fwd, a, call);
}

void flce_bwd(const hk_call& call) {
  liger::FusedLinearCrossEntropyArgs a;
  flce_args(call, 1, &a);
  a.dloss = loss_out(&hk::sdk::input(call, 0, "dloss"), a.reduction, a.hidden.rows, "dloss");
  flce_grads(call, 0, &a);
  if (!a.dhidden.data)
    fail(HK_STATUS_INVALID_ARGUMENT, "fused_linear_cross_entropy backward: missing output dx");
  check_workspace(call, flce_ws(call, HK_PASS_BACKWARD), "fused_linear_cross_entropy backward");
  a.workspace = call.workspace;
  LIGER_RUN(fused_linear_cross_entropy_fwd, a, call);
}

// ---- causal_lm_loss@1 ---------------------------------------------------------------------------
// Shift the labels (into the workspace on cuda), then cross-entropy over [B·T, V] with Mean, or
// Sum / num_items_in_batch.
size_t causal_ws(const hk_call& call, uint32_t pass) {
  const hk_tensor& logits = hk::sdk::input(call, pass == HK_PASS_BACKWARD ? 1 : 0, "logits");
  const int64_t n = hk::sdk::rows(logits);
#if LIGER_CUDA
  return 256 + static_cast<size_t>(n) * 8 + liger::cuda::cross_entropy_workspace_bytes(n);
#else
  (void)n;
  return 0;
#endif
}

void causal_call(const hk_call& call, bool backward) {
  const auto at = hk::sdk::read_attrs<hk::CausalLmLossAttrs>(call);
  const int first = backward ? 1 : 0;
  const hk_tensor& logits = hk::sdk::input(call, first, "logits");
  const hk_tensor& labels = hk::sdk::input(call, first + 1, "labels");
  if (logits.ndim != 3 || labels.ndim != 2 || labels.shape[0] != logits.shape[0] ||
      labels.shape[1] != logits.shape[1])
    fail(HK_STATUS_INVALID_ARGUMENT, "causal_lm_loss: logits " + shape_of(logits) + " and labels " +
                                         shape_of(labels) + " must be [B, T, V] and [B, T]");
  check_device(labels, "labels");
  if (labels.dtype != HK_DTYPE_I32 && labels.dtype != HK_DTYPE_I64)
    fail(HK_STATUS_INVALID_ARGUMENT, "causal_lm_loss: labels must be i32 or i64");
  if (labels.shape[1] > 1 && labels.strides[1] != 1)
    fail(HK_STATUS_UNSUPPORTED, "causal_lm_loss: labels rows must be contiguous");
  const int64_t B = labels.shape[0], T = labels.shape[1], n = B * T;
  const IndexDt ldt = labels.dtype == HK_DTYPE_I32 ? IndexDt::I32 : IndexDt::I64;
  liger::CrossEntropyArgs a;
  a.logits = rows_of(logits, "logits");
  a.ignore_index = at.ignore_index;
  a.reduction = liger::Reduction::Mean;
  a.mean_divisor = at.num_items_in_batch > 0 ? static_cast<float>(at.num_items_in_batch) : 0.0f;
  check_workspace(call, causal_ws(call, backward ? HK_PASS_BACKWARD : HK_PASS_FORWARD),
                  "causal_lm_loss");
#if LIGER_CUDA
  int64_t* shifted = reinterpret_cast<int64_t*>(static_cast<char*>(call.workspace) + 256);
  run(liger::cuda::shift_labels(base(labels), ldt, B, T,
                                labels.shape[0] > 1 ? labels.strides[0] : T, at.ignore_index,
                                shifted, call.stream),
      "shift_labels");
  a.workspace = reinterpret_cast<char*>(shifted) + ((n * 8 + 255) / 256) * 256;
#else
  std::vector<int64_t> shifted_v(static_cast<size_t>(n > 0 ? n : 1));
  int64_t* shifted = shifted_v.data();
  liger::cpu::shift_labels(base(labels), ldt, B, T, labels.shape[0] > 1 ? labels.strides[0] : T,
                           at.ignore_index, shifted);
#endif
  a.labels = shifted, a.labels_dt = IndexDt::I64, a.labels_stride = 1;
  if (!backward) {
    a.loss = f32_of(&hk::sdk::output(call, 0, "loss"), 1, "loss");
  } else {
    a.dloss = f32_of(&hk::sdk::input(call, 0, "dloss"), 1, "dloss");
    const hk_tensor& g = hk::sdk::output(call, 0, "dlogits");
    same_shape(g, logits, "dlogits", "logits");
    a.dlogits = rows_of(g, "dlogits");
    if (a.dlogits.dt != a.logits.dt)
      fail(HK_STATUS_UNSUPPORTED, "causal_lm_loss: dlogits must have logits' dtype");
  }
  LIGER_RUN(cross_entropy_fwd, a, call);
}

}  // namespace

// The exported entry points (abi/entries.h declares them): each pass runs under the SDK's guard,
// which turns exceptions into status codes; workspace queries go through workspace_point.
#define LIGER_PASSES(fn, forward_call, backward_call)  \
  hk_status fn##_forward(const hk_call* c) noexcept {  \
    return hk::sdk::guard(c, [&] { forward_call; });   \
  }                                                    \
  hk_status fn##_backward(const hk_call* c) noexcept { \
    return hk::sdk::guard(c, [&] { backward_call; });  \
  }
#define LIGER_WORKSPACE(fn, query)                                             \
  hk_status fn##_workspace(const hk_call* c, uint32_t p, size_t* b) noexcept { \
    return hk::sdk::workspace_point<query>(c, p, b);                           \
  }
void unary_fixed(const hk_call& c, bool backward, liger::Act act, const char* name) {
  check_kind(c, act, name);
  unary_act_call(c, backward, act, name);
}
LIGER_PASSES(rms_norm, rms_fwd(*c), rms_bwd(*c))
LIGER_WORKSPACE(rms_norm, rms_ws)
LIGER_PASSES(layer_norm, ln_fwd(*c), ln_bwd(*c))
LIGER_WORKSPACE(layer_norm, ln_ws)
LIGER_PASSES(rotary, rope_call(*c, false), rope_call(*c, true))
LIGER_PASSES(silu, silu_call(*c, false), silu_call(*c, true))
LIGER_PASSES(silu_act, unary_fixed(*c, false, liger::Act::SiLU, "Silu"),
             unary_fixed(*c, true, liger::Act::SiLU, "Silu"))
LIGER_PASSES(gelu, unary_fixed(*c, false, liger::Act::GeluErf, "GELU"),
             unary_fixed(*c, true, liger::Act::GeluErf, "GELU"))
LIGER_PASSES(gelu_tanh, unary_fixed(*c, false, liger::Act::GeluTanh, "GeluTanh"),
             unary_fixed(*c, true, liger::Act::GeluTanh, "GeluTanh"))
LIGER_PASSES(quick_gelu, unary_fixed(*c, false, liger::Act::QuickGelu, "QuickGELU"),
             unary_fixed(*c, true, liger::Act::QuickGelu, "QuickGELU"))
LIGER_PASSES(silu_and_mul, act_and_mul_call(*c, false, liger::Act::SiLU, "silu_and_mul"),
             act_and_mul_call(*c, true, liger::Act::SiLU, "silu_and_mul"))
LIGER_PASSES(gelu_and_mul, act_and_mul_call(*c, false, liger::Act::GeluErf, "gelu_and_mul"),
             act_and_mul_call(*c, true, liger::Act::GeluErf, "gelu_and_mul"))
LIGER_PASSES(gelu_tanh_and_mul,
             act_and_mul_call(*c, false, liger::Act::GeluTanh, "gelu_tanh_and_mul"),
             act_and_mul_call(*c, true, liger::Act::GeluTanh, "gelu_tanh_and_mul"))
LIGER_PASSES(mlp, mlp_fwd_call(*c), mlp_bwd_call(*c))
LIGER_WORKSPACE(mlp, mlp_ws)
LIGER_PASSES(rms_norm_mlp, rms_mlp_fwd_call(*c), rms_mlp_bwd_call(*c))
LIGER_WORKSPACE(rms_norm_mlp, rms_mlp_ws)
LIGER_PASSES(linear, linear_fwd_call(*c), linear_bwd_call(*c))
LIGER_WORKSPACE(linear, linear_ws)
LIGER_PASSES(cross_entropy, ce_fwd(*c), ce_bwd(*c))
LIGER_WORKSPACE(cross_entropy, ce_ws)
LIGER_PASSES(flce, flce_fwd(*c), flce_bwd(*c))
LIGER_WORKSPACE(flce, flce_ws)
LIGER_PASSES(causal_lm, causal_call(*c, false), causal_call(*c, true))
LIGER_WORKSPACE(causal_lm, causal_ws)
#undef LIGER_WORKSPACE
#undef LIGER_PASSES

}  // namespace liger_abi::LIGER_NS
