// Helpers for the GPU tests: random CPU tensors, GPU copies in chosen layouts (contiguous, padded
// rows, transposed), NaN-poisoned outputs, and a comparison that reports the first mismatches.
//
// The reference is always the CPU path of the same hk op on the same inputs (already rounded to
// the output dtype by that op); the GPU result passes when |gpu − ref| ≤ atol + rtol·|ref| for
// every element. Outputs are poisoned with NaN first, so an element the kernel never wrote fails.
// Without a CUDA device the tests are skipped, unless HK_REQUIRE_GPU=1 (scripts/gpu-test sets
// it), in which case they fail: on the GPU machine a skip must never look like a pass.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hk/allocator.h"
#include "hk/device.h"
#include "hk/ops.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk::gpu_testing {

inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}
inline bool gpu_required() {
  return env_is("HK_REQUIRE_GPU", "1");
}
// Harness self-check without a GPU: HK_GPU_TESTS_ON_CPU=1 runs the op tests with the "GPU" side on
// the CPU too, which checks that every call the tests make is accepted by the dispatchers and that
// the comparisons pass for identical paths. It says nothing about the CUDA kernels.
inline bool harness_on_cpu() {
  return env_is("HK_GPU_TESTS_ON_CPU", "1");
}

// At the top of every op test: skips (or fails, when required) without a CUDA device.
#define HK_REQUIRE_CUDA()                                                         \
  do {                                                                            \
    if (!::hk::gpu_testing::harness_on_cpu() && ::hk::cuda_device_count() == 0) { \
      if (::hk::gpu_testing::gpu_required()) FAIL() << "no CUDA device visible";  \
      GTEST_SKIP() << "no CUDA device";                                           \
    }                                                                             \
  } while (0)
// At the top of tests of the CUDA runtime itself (never run on the CPU).
#define HK_REQUIRE_REAL_CUDA()                                                   \
  do {                                                                           \
    if (::hk::cuda_device_count() == 0) {                                        \
      if (::hk::gpu_testing::gpu_required()) FAIL() << "no CUDA device visible"; \
      GTEST_SKIP() << "no CUDA device";                                          \
    }                                                                            \
  } while (0)

inline Device gpu() {
  return harness_on_cpu() ? Device::cpu() : Device::cuda(0);
}

inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> d{DType::F32, DType::BF16, DType::F16};
  return d;
}

// Uniform random values in [lo, hi), converted to `dtype` (deterministic per seed).
inline Tensor random_cpu(const Shape& shape, DType dtype, uint32_t seed, float lo = -1.0f,
                         float hi = 1.0f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_floats(v, shape, dtype);
}

inline Tensor random_ints(const Shape& shape, int64_t lo, int64_t hi, uint32_t seed,
                          DType dtype = DType::I64) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_ints(v, shape, dtype);
}

enum class Layout { Contiguous, PaddedRows, Transposed };
inline const char* layout_name(Layout l) {
  return l == Layout::Contiguous ? "contiguous" : l == Layout::PaddedRows ? "padded" : "transposed";
}

// A GPU view with the values of `cpu` in the requested layout:
//  PaddedRows  — rows of a wider buffer (last dim contiguous, row stride = cols + 5);
//  Transposed  — the last two dims stored swapped (last-dim stride ≠ 1; needs ndim ≥ 2).
inline Tensor to_gpu(const Tensor& cpu, Layout layout = Layout::Contiguous, Stream stream = {}) {
  const Shape shape = cpu.sizes();
  Tensor out;
  if (layout == Layout::Contiguous || shape.empty()) {
    out = Tensor::empty(shape, cpu.dtype(), gpu(), stream);
  } else if (layout == Layout::PaddedRows) {
    Shape wide = shape;
    wide.back() += 5;
    out = Tensor::empty(wide, cpu.dtype(), gpu(), stream).slice(-1, 0, shape.back());
  } else {
    Shape swapped = shape;
    const size_t n = swapped.size();
    if (n < 2) return to_gpu(cpu, Layout::PaddedRows, stream);
    std::swap(swapped[n - 1], swapped[n - 2]);
    out = Tensor::empty(swapped, cpu.dtype(), gpu(), stream).transpose(-1, -2);
  }
  out.copy_from(cpu.view(), stream);
  return out;
}

inline Tensor to_cpu(const Tensor& t, Stream stream = {}) {
  Tensor c = t.to(Device::cpu(), stream);
  synchronize(t.device(), stream);
  return c;
}

// An uninitialised GPU output in `layout`, filled with NaN (floats) or a sentinel (ints).
inline Tensor gpu_output(const Shape& shape, DType dtype, Layout layout = Layout::Contiguous) {
  Tensor host = Tensor::empty(shape, dtype);
  Tensor out = to_gpu(host, layout);
  ops::fill(out, is_floating(dtype) ? NAN : -7777.0);
  return out;
}

inline std::string values_at(const std::vector<double>& v, size_t i) {
  std::ostringstream s;
  s << v[i];
  return s.str();
}

// Compares a GPU tensor with the CPU reference; reports up to 5 mismatches.
inline ::testing::AssertionResult close(const Tensor& got_gpu, const Tensor& ref_cpu, double atol,
                                        double rtol) {
  if (got_gpu.sizes() != ref_cpu.sizes())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(got_gpu.sizes()) << " vs " << shape_str(ref_cpu.sizes());
  const std::vector<double> got = to_cpu(got_gpu).to_doubles();
  const std::vector<double> ref = ref_cpu.to_doubles();
  size_t bad = 0;
  std::ostringstream msg;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    bool ok;
    if (std::isnan(r))
      ok = std::isnan(g);
    else if (std::isinf(r))
      ok = g == r;
    else
      ok = std::isfinite(g) && std::fabs(g - r) <= atol + rtol * std::fabs(r);
    if (!ok) {
      if (bad < 5) msg << "\n  [" << i << "] gpu " << g << " ref " << r;
      ++bad;
    }
    if (std::isfinite(g) && std::isfinite(r)) worst = std::max(worst, std::fabs(g - r));
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ (atol " << atol << ", rtol " << rtol
         << ", max |diff| " << worst << ")" << msg.str();
}

// Tolerances for elementwise results: about two units in the last place of the dtype.
inline double rtol_for(DType dt) {
  switch (dt) {
    case DType::BF16:
      return 1.6e-2;
    case DType::F16:
      return 2e-3;
    default:
      return 2e-5;
  }
}
inline double atol_for(DType dt) {
  switch (dt) {
    case DType::BF16:
      return 1e-2;
    case DType::F16:
      return 1e-3;
    default:
      return 1e-5;
  }
}

}  // namespace hk::gpu_testing
