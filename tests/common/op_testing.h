// tests/common/op_testing.h — shared helpers for testing ops and kernels against references.
//
// Random tensors with a fixed seed, the same values laid out in non-contiguous ways (strided,
// transposed, padded rows; use Tensor::expand for broadcast), the project tolerance rule
// (atol + rtol·|ref| with the double reference first rounded to the output dtype, plus a
// per-element bound for reductions from a same-dtype naive implementation), the exact-match share
// for 16-bit outputs, central finite differences for backward checks and HK_EXPECT_INVALID.
// Header-only, CPU only: GPU tests copy their results to the CPU first. It deliberately holds no
// reference implementations; every test writes its own naive double-precision reference. The
// namespace is hk::test (not hk::testing, which would hide GoogleTest's ::testing inside namespace
// hk).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hk/dtype.h"
#include "hk/error.h"
#include "hk/tensor.h"

namespace hk::test {

// The dtypes every op is tested in (f64 is used for finite differences and exact references).
inline constexpr DType kTestDtypes[] = {DType::F32, DType::BF16, DType::F16};

// ---- values -------------------------------------------------------------------------------------

// Stores `values` (row-major) into a new contiguous CPU tensor of `dtype`, rounding as the dtype
// requires. Unlike Tensor::from_floats, f64 keeps full double precision.
inline Tensor tensor_from_doubles(const std::vector<double>& values, const Shape& shape,
                                  DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw InvalidArgument("tensor_from_doubles: " + std::to_string(values.size()) +
                          " values for shape " + shape_str(shape));
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DType::F64:
        t.data_as<double>()[i] = v;
        break;
      case DType::F32:
        t.data_as<float>()[i] = static_cast<float>(v);
        break;
      case DType::BF16:
        t.data_as<bf16_t>()[i] = float_to_bf16(static_cast<float>(v));
        break;
      case DType::F16:
        t.data_as<f16_t>()[i] = float_to_f16(static_cast<float>(v));
        break;
      case DType::I32:
        t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DType::I64:
        t.data_as<int64_t>()[i] = static_cast<int64_t>(v);
        break;
      case DType::U8:
        t.data_as<uint8_t>()[i] = static_cast<uint8_t>(v);
        break;
      case DType::Bool:
        t.data_as<uint8_t>()[i] = v != 0;
        break;
    }
  }
  return t;
}

// Uniform values in [lo, hi) stored in `dtype` (so the tensor holds exactly representable values,
// and `values(t)` gives the inputs a reference should use).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1.0,
                            double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return tensor_from_doubles(v, shape, dtype);
}

// Uniform integers in [lo, hi) (ids, labels, positions).
inline Tensor random_ints(const Shape& shape, DType dtype, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& x : v) x = dist(rng);
  return Tensor::from_ints(v, shape, dtype);
}

// The elements of any CPU view as doubles, in row-major order of its shape.
inline std::vector<double> values(const TensorView& v) {
  return Tensor::wrap(v).to_doubles();
}

// ---- layouts ------------------------------------------------------------------------------------

enum class Layout {
  Contiguous,
  Strided,     // every other element of the last dim (stride 2 there)
  Transposed,  // the last two dims swapped in memory, then transposed back (column-major-ish)
  PaddedRows,  // rows of the last dim padded by 3 elements (dense rows, row stride > size)
};

inline const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::Strided:
      return "strided";
    case Layout::Transposed:
      return "transposed";
    case Layout::PaddedRows:
      return "padded_rows";
  }
  return "?";
}

inline constexpr Layout kAllLayouts[] = {Layout::Contiguous, Layout::Strided, Layout::Transposed,
                                         Layout::PaddedRows};

// A tensor of `shape`/`dtype` for an op to write, whose view has the requested layout. All of its
// storage holds NaN (floating) or 77 (integers), so elements an op forgets to write show up in
// comparisons. Transposed needs rank ≥ 2 (falls back to Strided for rank < 2).
inline Tensor empty_with_layout(const Shape& shape, DType dtype, Layout layout) {
  const int nd = static_cast<int>(shape.size());
  if (layout == Layout::Transposed && nd < 2) layout = Layout::Strided;
  Shape alloc = shape;
  if (nd == 0) layout = Layout::Contiguous;
  switch (layout) {
    case Layout::Contiguous:
      break;
    case Layout::Strided:
      alloc[nd - 1] = 2 * shape[nd - 1];
      break;
    case Layout::Transposed:
      std::swap(alloc[nd - 1], alloc[nd - 2]);
      break;
    case Layout::PaddedRows:
      alloc[nd - 1] = shape[nd - 1] + 3;
      break;
  }
  int64_t n = 1;
  for (int64_t s : alloc) n *= s;
  const double sentinel = is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : 77.0;
  Tensor base =
      tensor_from_doubles(std::vector<double>(static_cast<size_t>(n), sentinel), alloc, dtype);
  switch (layout) {
    case Layout::Contiguous:
      return base;
    case Layout::Strided:
      return base.slice(nd - 1, 0, 2 * shape[nd - 1], 2);
    case Layout::Transposed:
      return base.transpose(nd - 1, nd - 2);
    case Layout::PaddedRows:
      return base.slice(nd - 1, 0, shape[nd - 1]);
  }
  return base;
}

// The same values as `t` in a view with the requested layout (new storage).
inline Tensor with_layout(const Tensor& t, Layout layout) {
  Tensor out = empty_with_layout(t.sizes(), t.dtype(), layout);
  out.copy_from(t.view());
  return out;
}

// ---- rounding and tolerance
// ----------------------------------------------------------------------

// Rounds a double the way storing it in `dtype` would (f64: identity).
inline double round_to_dtype(double v, DType dtype) {
  switch (dtype) {
    case DType::F64:
      return v;
    case DType::F32:
      return static_cast<float>(v);
    case DType::BF16:
      return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    case DType::F16:
      return f16_to_float(float_to_f16(static_cast<float>(v)));
    default:
      return v;
  }
}

// Unit roundoff of a dtype (half an ulp at 1).
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return 0x1p-53;
    case DType::F32:
      return 0x1p-24;
    case DType::BF16:
      return 0x1p-8;
    case DType::F16:
      return 0x1p-11;
    default:
      return 0;
  }
}

struct Tolerance {
  double atol = 0;
  double rtol = 0;
};

// Tolerance for an op that computes in f32 (f64 for f64) and rounds once to `dtype`: the f32
// computation may land on the other side of a rounding boundary, so allow two ulps of the dtype.
inline Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64:
      return {1e-12, 1e-12};
    case DType::F32:
      return {1e-6, 1e-5};
    case DType::BF16:
      return {1e-5, 4 * unit_roundoff(DType::BF16)};
    case DType::F16:
      return {1e-6, 4 * unit_roundoff(DType::F16)};
    default:
      return {0, 0};
  }
}

// Checks |out - round(ref)| ≤ atol + rtol·|round(ref)| + extra[i] for every element, where
// round() stores the double reference in out's dtype. `extra` (empty or one per element) carries
// the bound of a reduction: e.g. k·K·u(f32)·Σ|a·b| for a dot product of length K accumulated in
// f32. NaN in out fails unless the reference is NaN too. Reports the worst elements.
inline ::testing::AssertionResult all_close(const TensorView& out, const std::vector<double>& ref,
                                            Tolerance tol, const std::vector<double>& extra = {}) {
  const std::vector<double> got = values(out);
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size mismatch: output " << out.str() << " has "
                                         << got.size() << " elements, reference " << ref.size();
  if (!extra.empty() && extra.size() != ref.size())
    return ::testing::AssertionFailure() << "extra bound has " << extra.size() << " elements";
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = round_to_dtype(ref[i], out.dtype);
    const double bound = tol.atol + tol.rtol * std::fabs(r) + (extra.empty() ? 0.0 : extra[i]);
    const double err = std::fabs(got[i] - r);
    const bool ok = (std::isnan(r) && std::isnan(got[i])) || (r == got[i]) || err <= bound;
    if (!ok) {
      if (bad < 5)
        first << "\n  [" << i << "] got " << got[i] << " ref " << ref[i] << " (rounded " << r
              << ") err " << err << " bound " << bound;
      ++bad;
      const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / bound;
      if (ratio > worst_ratio || bad == 1) worst_ratio = ratio, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements of " << out.str()
         << " out of tolerance (atol " << tol.atol << ", rtol " << tol.rtol << "); worst [" << worst
         << "] got " << got[worst] << " ref " << ref[worst] << first.str();
}

inline ::testing::AssertionResult all_close(const TensorView& out, const std::vector<double>& ref,
                                            const std::vector<double>& extra = {}) {
  return all_close(out, ref, default_tolerance(out.dtype), extra);
}

// Fraction of elements where out equals the reference rounded to out's dtype exactly. A 16-bit
// op that follows the reference's rounding steps matches almost everywhere (only f32-vs-double
// ties flip), while a missing intermediate rounding (e.g. of act(gate) before ·up) shows up as a
// large share of one-ulp differences that the ulp-based tolerance alone cannot see.
inline double exact_fraction(const TensorView& out, const std::vector<double>& ref) {
  const std::vector<double> got = values(out);
  if (got.empty()) return 1.0;
  size_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) same += got[i] == round_to_dtype(ref[i], out.dtype);
  return static_cast<double>(same) / static_cast<double>(got.size());
}

// Extra bound for a reduction, per ARCHITECTURE.md: `k` × the largest error of a same-dtype naive
// implementation (e.g. the test's reference templated on float instead of double, accumulating in
// the order written) against the double reference, for every element. Far tighter than the
// worst-case n·u·Σ|terms| bound, yet independent of the summation order the op uses.
inline std::vector<double> naive_bound(const std::vector<double>& ref,
                                       const std::vector<double>& naive, double k = 4.0) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(naive[i] - ref[i]));
  return std::vector<double>(ref.size(), k * worst);
}

// ---- finite differences -------------------------------------------------------------------------

// Central differences of the scalar `loss()` with respect to every element of `x` (a contiguous
// f64 CPU tensor that `loss` reads): returns d loss / d x, row-major.
inline std::vector<double> numeric_gradient(const Tensor& x, const std::function<double()>& loss,
                                            double h = 1e-6) {
  if (x.dtype() != DType::F64 || !x.is_contiguous())
    throw InvalidArgument("numeric_gradient needs a contiguous f64 tensor, got " + x.view().str());
  double* p = x.data_as<double>();
  std::vector<double> g(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    g[static_cast<size_t>(i)] = (up - down) / (2 * h);
  }
  return g;
}

// Σ w_i·v_i over the elements of a view: turns a tensor output into a scalar loss whose gradient
// with respect to the output is `w` (use w = values(dy) to test a backward op with incoming dy).
inline double weighted_sum(const TensorView& out, const std::vector<double>& w) {
  const std::vector<double> v = values(out);
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

// ---- errors -------------------------------------------------------------------------------------

// Asserts that `statement` throws hk::InvalidArgument whose message contains `needle` (the op
// name).
#define HK_EXPECT_INVALID(statement, needle)                                                \
  do {                                                                                      \
    try {                                                                                   \
      statement;                                                                            \
      ADD_FAILURE() << "expected hk::InvalidArgument from: " #statement;                    \
    } catch (const ::hk::InvalidArgument& e) {                                              \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)                      \
          << "message does not name '" << (needle) << "': " << e.what();                    \
    } catch (const std::exception& e) {                                                     \
      ADD_FAILURE() << "expected hk::InvalidArgument, got another exception: " << e.what(); \
    }                                                                                       \
  } while (0)

}  // namespace hk::test
