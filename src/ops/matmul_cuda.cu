// CUDA matmul, linear and linear_backward through cuBLASLt.
//
// Row-major hk views are handed to column-major cuBLASLt as their transposes: C = op(A)·op(B)
// becomes Cᵀ = op(B)ᵀ·op(A)ᵀ, so no data moves. An operand that is row-major or column-major with a
// leading dimension (plain and transposed views) is used in place; anything else is copied first.
// Per device: one cuBLASLt handle; per (device, stream): one 32 MiB workspace (a workspace must not
// be shared by concurrent streams). Per problem (dtype, shapes, leading dims, batch strides,
// alignment, epilogue): the matmul and layout descriptors plus the heuristic's first algorithm,
// created once and reused, so a steady-state call does no descriptor work. Accumulation is f32
// (CUBLAS_COMPUTE_32F, no TF32: f32 inputs give f32-exact results like torch's default).
// Not here: fp8, split-K tuning, autotuning beyond the heuristic's first choice.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "ops/column_sum_cuda.cuh"
#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"
#include "ops/gemm_cuda.cuh"

namespace hk::ops::cuda {
namespace {
using namespace detail;

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string("cuBLASLt call ") + what + " failed with status " +
                         std::to_string(static_cast<int>(status)) +
                         " (check that the GPU and driver support this dtype and shape)");
}
#define HK_CUBLAS_CHECK(call) check_cublas((call), #call)

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      unsupported_dtype("matmul", dt);
  }
}

struct Context {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, void*>, void*> workspaces;
};
Context& context() {
  static Context* ctx = new Context();  // leaked on purpose: no teardown order issues at exit
  return *ctx;
}

// Operand of a GEMM as cuBLASLt sees it (column-major storage).
struct BlasMatrix {
  const void* ptr = nullptr;
  bool transpose = false;              // op applied by cuBLASLt
  int64_t rows = 0, cols = 0, ld = 0;  // the stored column-major matrix
  int64_t batch_stride = 0;
};

// A 2-D (or batched 3-D) view of logical shape R×C: row-major (col stride 1) or column-major
// (row stride 1) with a leading dimension; false when neither (caller copies).
bool classify(const TensorView& v, bool& row_major, int64_t& ld) {
  const int64_t r = v.shape[v.ndim - 2], c = v.shape[v.ndim - 1];
  const int64_t sr = v.strides[v.ndim - 2], sc = v.strides[v.ndim - 1];
  if ((c == 1 || sc == 1) && (r == 1 || sr >= std::max<int64_t>(c, 1))) {
    row_major = true;
    ld = r == 1 ? std::max<int64_t>(c, 1) : sr;
    return true;
  }
  if ((r == 1 || sr == 1) && (c == 1 || sc >= std::max<int64_t>(r, 1))) {
    row_major = false;
    ld = c == 1 ? std::max<int64_t>(r, 1) : sc;
    return true;
  }
  return false;
}

int alignment_bytes(const void* p, int64_t ld, int64_t batch_stride, size_t es) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld * es) |
                   uintptr_t(batch_stride * es) | uintptr_t(256);
  return static_cast<int>(bits & (~bits + 1));  // lowest set bit, at most 256
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
using PlanKey = std::array<int64_t, 22>;
std::map<PlanKey, Plan>& plans() {
  static auto* p = new std::map<PlanKey, Plan>();
  return *p;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, const BlasMatrix& m, int64_t batch) {
  cublasLtMatrixLayout_t layout;
  HK_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, type, uint64_t(m.rows), uint64_t(m.cols), m.ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    HK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &count, sizeof(count)));
    HK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.batch_stride, sizeof(int64_t)));
  }
  return layout;
}

// D = alpha·op(A)·op(B) + beta·C in cuBLASLt's column-major terms, D == C in memory.
// `bias` (length = rows of D, dtype of D) is added by the epilogue before the single rounding.
void blas_gemm(DType dt, DType c_dt, int64_t m, int64_t n, int64_t k, int64_t batch,
               const BlasMatrix& A, const BlasMatrix& B, void* C, int64_t ldc,
               int64_t c_batch_stride, float alpha, float beta, const void* bias,
               cudaStream_t stream) {
  const cudaDataType_t type = cuda_type(dt);
  const cudaDataType_t c_type = cuda_type(c_dt);
  const size_t es = dtype_size(dt);
  const int device = current_device();
  Context& ctx = context();
  std::lock_guard lock(ctx.mutex);
  cublasLtHandle_t& handle = ctx.handles[device];
  if (!handle) HK_CUBLAS_CHECK(cublasLtCreate(&handle));
  void*& workspace = ctx.workspaces[{device, static_cast<void*>(stream)}];
  if (!workspace) HK_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));

  const int align_a = alignment_bytes(A.ptr, A.ld, A.batch_stride, es);
  const int align_b = alignment_bytes(B.ptr, B.ld, B.batch_stride, es);
  const int align_c = alignment_bytes(C, ldc, c_batch_stride, dtype_size(c_dt));
  const PlanKey key{int64_t(dt),
                    device,
                    m,
                    n,
                    k,
                    batch,
                    A.transpose,
                    B.transpose,
                    A.rows,
                    A.ld,
                    A.batch_stride,
                    B.rows,
                    B.ld,
                    B.batch_stride,
                    ldc,
                    c_batch_stride,
                    align_a,
                    align_b,
                    align_c,
                    bias != nullptr,
                    beta != 0.0f,
                    int64_t(c_dt)};
  auto found = plans().find(key);
  if (found == plans().end()) {
    Plan plan;
    HK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = A.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = B.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    HK_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    HK_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      HK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof(epilogue)));
      HK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
    }
    plan.a = make_layout(type, A, batch);
    plan.b = make_layout(type, B, batch);
    plan.c = make_layout(c_type, BlasMatrix{C, false, m, n, ldc, c_batch_stride}, batch);

    cublasLtMatmulPreference_t pref;
    HK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    HK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t al[3] = {uint32_t(align_a), uint32_t(align_b), uint32_t(align_c)};
    HK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof(uint32_t)));
    HK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof(uint32_t)));
    HK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof(uint32_t)));
    HK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.c);
      cublasLtMatmulDescDestroy(plan.desc);
      throw Unsupported("matmul: cuBLASLt has no algorithm for " + std::string(dtype_name(dt)) +
                        " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                        " k=" + std::to_string(k) + " (status " + std::to_string(int(st)) +
                        "); make the operands contiguous or use f32");
    }
    plan.algo = result.algo;
    found = plans().emplace(key, plan).first;
  }
  Plan& plan = found->second;
  if (bias)
    HK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  HK_CUBLAS_CHECK(cublasLtMatmul(handle, plan.desc, &alpha, A.ptr, plan.a, B.ptr, plan.b, &beta, C,
                                 plan.c, C, plan.c, &plan.algo, workspace, kWorkspaceBytes,
                                 stream));
}

// C[batch?, M, N] = alpha·A_eff·B_eff + beta·C for effective (already transposed) views A_eff
// [batch?, M, K] and B_eff [batch?, K, N]; batch 1 of B broadcasts. `bias` [N] in C's dtype.
void gemm_views(const TensorView& a_in, const TensorView& b_in, const TensorView& c_in, float alpha,
                float beta, const TensorView* bias, Stream stream) {
  const DType dt = c_in.dtype;
  const cudaStream_t s = native(stream);
  const bool batched = c_in.ndim == 3;
  const int64_t batch = batched ? c_in.shape[0] : 1;
  const int64_t M = c_in.shape[c_in.ndim - 2], N = c_in.shape[c_in.ndim - 1];
  const int64_t K = a_in.shape[a_in.ndim - 1];
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {  // empty sum: C = beta·C (+ bias)
    if (beta == 0.0f)
      fill(c_in, 0.0, stream);
    else
      scale(c_in, beta, c_in, stream);
    if (bias) add(c_in, bias->expand(c_in.sizes()), c_in, 1.0f, stream);
    return;
  }

  Tensor keep_a, keep_b, keep_c;
  TensorView a = a_in, b = b_in;
  bool a_row, b_row, c_row;
  int64_t lda, ldb, ldc;
  if (!classify(a, a_row, lda)) {
    keep_a = Tensor::wrap(a).contiguous(stream);
    a = keep_a.view();
    classify(a, a_row, lda);
  }
  if (!classify(b, b_row, ldb)) {
    keep_b = Tensor::wrap(b).contiguous(stream);
    b = keep_b.view();
    classify(b, b_row, ldb);
  }
  TensorView c = c_in;
  if (!classify(c, c_row, ldc) || !c_row) {
    keep_c = Tensor::empty(c_in.sizes(), dt, c_in.device, stream);
    if (beta != 0.0f) copy_view(keep_c.view(), c_in, stream);
    c = keep_c.view();
    classify(c, c_row, ldc);
  }
  const int64_t a_bs = batched && a.ndim == 3 && a.shape[0] > 1 ? a.strides[0] : 0;
  const int64_t b_bs = batched && b.ndim == 3 && b.shape[0] > 1 ? b.strides[0] : 0;
  const int64_t c_bs = batched ? c.strides[0] : 0;

  // cuBLASLt's A is our B_eff (N×K after op), its B is our A_eff (K×M after op).
  BlasMatrix blas_a, blas_b;
  blas_a.ptr = b.ptr();
  blas_a.transpose = !b_row;
  blas_a.rows = b_row ? N : K;
  blas_a.cols = b_row ? K : N;
  blas_a.ld = ldb;
  blas_b.ptr = a.ptr();
  blas_b.transpose = !a_row;
  blas_b.rows = a_row ? K : M;
  blas_b.cols = a_row ? M : K;
  blas_b.ld = lda;
  const void* bias_ptr = nullptr;
  Tensor keep_bias;
  bool bias_after = false;
  if (bias) {
    if (bias->dtype == dt && !batched) {
      bias_ptr = contiguous_input(*bias, keep_bias, stream).ptr();
    } else {
      bias_after = true;
    }
  }

  // Strided batches with a zero stride (broadcast) are issued one by one; cuBLASLt's strided
  // batch is used only with real strides.
  const bool loop = batched && batch > 1 && (a_bs == 0 || b_bs == 0 || c_bs == 0);
  const size_t es = dtype_size(dt);
  if (!loop) {
    blas_a.batch_stride = b_bs;
    blas_b.batch_stride = a_bs;
    blas_gemm(dt, dt, N, M, K, batch, blas_a, blas_b, c.ptr(), ldc, c_bs, alpha, beta, bias_ptr, s);
  } else {
    for (int64_t i = 0; i < batch; ++i) {
      BlasMatrix ai = blas_a, bi = blas_b;
      ai.ptr = static_cast<const char*>(blas_a.ptr) + i * b_bs * es;
      bi.ptr = static_cast<const char*>(blas_b.ptr) + i * a_bs * es;
      blas_gemm(dt, dt, N, M, K, 1, ai, bi, static_cast<char*>(c.ptr()) + i * c_bs * es, ldc, 0,
                alpha, beta, nullptr, s);
    }
  }
  if (keep_c.defined()) copy_view(c_in, keep_c.view(), stream);
  if (bias_after) {
    add(c_in, bias->expand(c_in.sizes()), c_in, 1.0f, stream);
  }
}

}  // namespace

namespace detail {
void gemm_strided_batched(DType ab_dtype, DType c_dtype, int64_t batch, int64_t M, int64_t N,
                          int64_t K, const void* A, int64_t lda, int64_t stride_a, const void* B,
                          int64_t ldb, int64_t stride_b, bool trans_b, void* C, int64_t ldc,
                          int64_t stride_c, float alpha, float beta, Stream stream) {
  // Cᵀ (N×M, column-major) = op(B)ᵀ·Aᵀ, as in gemm_views: cuBLASLt's A is our B, its B our A.
  BlasMatrix blas_a, blas_b;
  blas_a.ptr = B;
  blas_a.transpose = trans_b;  // B stored [N, K] row-major = K×N column-major: transpose it
  blas_a.rows = trans_b ? K : N;
  blas_a.cols = trans_b ? N : K;
  blas_a.ld = ldb;
  blas_a.batch_stride = batch > 1 ? stride_b : 0;
  blas_b.ptr = A;
  blas_b.transpose = false;
  blas_b.rows = K;
  blas_b.cols = M;
  blas_b.ld = lda;
  blas_b.batch_stride = batch > 1 ? stride_a : 0;
  blas_gemm(ab_dtype, c_dtype, N, M, K, batch, blas_a, blas_b, C, ldc, batch > 1 ? stride_c : 0,
            alpha, beta, nullptr, native(stream));
}
}  // namespace detail

namespace {

TensorView last_two_swapped(const TensorView& v) {
  return v.transpose(v.ndim - 2, v.ndim - 1);
}

// x [..., K] viewed as a 2-D [rows, K] matrix (copying when its rows are not dense).
TensorView as_matrix(const TensorView& v, Tensor& keep, Stream stream) {
  const TensorView d = dense_rows_input(v, keep, stream);
  const Rows r = rows_of(d);
  TensorView m = d;
  m.ndim = 2;
  m.shape[0] = r.rows;
  m.shape[1] = r.cols;
  m.strides[0] = r.row_stride;
  m.strides[1] = 1;
  m.byte_offset = d.byte_offset;
  return m;
}

}  // namespace

void matmul(const TensorView& a, const TensorView& b, const TensorView& c,
            const MatmulOptions& options, Stream stream) {
  require_float("matmul", c.dtype);
  DeviceGuard guard(c.device);
  const TensorView a_eff = options.trans_a ? last_two_swapped(a) : a;
  const TensorView b_eff = options.trans_b ? last_two_swapped(b) : b;
  gemm_views(a_eff, b_eff, c, options.alpha, options.beta, nullptr, stream);
}

void linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
            Stream stream) {
  require_float("linear", y.dtype);
  DeviceGuard guard(y.device);
  Tensor keep_x;
  const TensorView x2 = as_matrix(x, keep_x, stream);
  WritableOutput out(y, false, false, stream);
  Tensor keep_y;
  const TensorView y2 = as_matrix(out.view(), keep_y, stream);
  gemm_views(x2, last_two_swapped(w), y2, 1.0f, 0.0f, bias, stream);
  out.finish(stream);
}

void linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                     const TensorView* dx, const TensorView* dw, const TensorView* dbias,
                     bool accumulate, Stream stream) {
  require_float("linear_backward", dy.dtype);
  DeviceGuard guard(dy.device);
  Tensor keep_dy, keep_x;
  const TensorView dy2 = as_matrix(dy, keep_dy, stream);
  if (dx) {  // dx[rows, K] = dy[rows, N] · w[N, K]
    WritableOutput out(*dx, false, false, stream);
    Tensor keep;
    gemm_views(dy2, w, as_matrix(out.view(), keep, stream), 1.0f, 0.0f, nullptr, stream);
    out.finish(stream);
  }
  if (dw) {  // dw[N, K] (+)= dy[rows, N]ᵀ · x[rows, K]
    const TensorView x2 = as_matrix(x, keep_x, stream);
    gemm_views(last_two_swapped(dy2), x2, *dw, 1.0f, accumulate ? 1.0f : 0.0f, nullptr, stream);
  }
  if (dbias) {
    const Rows r = rows_of(dy2);
    ColumnSumTerms terms;
    terms.a = r.ptr;
    terms.a_dtype = dy.dtype;
    terms.a_row_stride = r.row_stride;
    column_sum(terms, r.rows, r.cols, *dbias, accumulate, stream);
  }
}

}  // namespace hk::ops::cuda
