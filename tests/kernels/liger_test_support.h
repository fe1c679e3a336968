// tests/kernels/liger_test_support.h — buffers and comparisons for the liger kernel tests.
//
// A Buf is a host matrix in one dtype (with an optional row padding, to make inputs
// non-contiguous) plus, in the cuda tests, a device mirror. The test bodies (liger_cases.inc)
// are shared by the cpu and cuda test programs; each program defines the backend (`kOnDevice`,
// `dev_alloc`, `dev_upload`, `dev_download`) before including them. Comparisons use
// |out − ref| ≤ atol + rtol·|ref| with the double reference first rounded to the output dtype.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "liger/args.h"
#include "liger/host_numerics.h"

namespace liger_test {

using liger::Dt;

// Backend hooks (defined by the including test program).
void* dev_alloc(size_t bytes);  // device (or host) memory, freed at program exit
void dev_upload(void* dst, const void* src, size_t bytes);
void dev_download(void* dst, const void* src, size_t bytes);

inline const char* dt_name(Dt dt) {
  return dt == Dt::F32 ? "f32" : dt == Dt::BF16 ? "bf16" : "f16";
}

struct Buf {
  Dt dt = Dt::F32;
  int64_t rows = 0, cols = 0, stride = 0;
  std::vector<uint8_t> host;
  void* dev = nullptr;

  Buf() = default;
  Buf(Dt d, int64_t r, int64_t c, int64_t pad = 0) : dt(d), rows(r), cols(c), stride(c + pad) {
    host.assign(static_cast<size_t>((r > 0 ? r : 1) * stride) * liger::dt_size(dt) + 64, 0);
  }
  size_t bytes() const { return host.size(); }
  float get(int64_t r, int64_t c) const {
    return liger::host::load(host.data(), dt, r * stride + c);
  }
  void set(int64_t r, int64_t c, float v) {
    liger::host::store(host.data(), dt, r * stride + c, v);
  }
  // Uploads (once) and returns the pointer the kernels see.
  void* ptr() {
    if (!dev) dev = dev_alloc(bytes());
    dev_upload(dev, host.data(), bytes());
    return dev;
  }
  void pull() { dev_download(host.data(), dev, bytes()); }
  liger::Rows rows_view() { return liger::Rows{ptr(), rows, cols, stride, dt}; }
  liger::Vec vec() { return liger::Vec{ptr(), dt}; }
};

// f32 vector on the device (losses, lse, rstd ...).
struct FBuf {
  std::vector<float> host;
  float* dev = nullptr;
  explicit FBuf(size_t n, float fill = NAN) : host(n ? n : 1, fill) {}
  float* ptr() {
    if (!dev) dev = static_cast<float*>(dev_alloc(host.size() * 4));
    dev_upload(dev, host.data(), host.size() * 4);
    return dev;
  }
  void pull() { dev_download(host.data(), dev, host.size() * 4); }
};

struct IBuf {
  std::vector<int64_t> host;
  int64_t* dev = nullptr;
  explicit IBuf(std::vector<int64_t> v) : host(std::move(v)) {
    if (host.empty()) host.push_back(0);
  }
  int64_t* ptr() {
    if (!dev) dev = static_cast<int64_t*>(dev_alloc(host.size() * 8));
    dev_upload(dev, host.data(), host.size() * 8);
    return dev;
  }
};

inline std::mt19937& rng() {
  static std::mt19937 g(1234);
  return g;
}

inline void fill_normal(Buf& b, float scale = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, scale);
  for (int64_t r = 0; r < b.rows; ++r)
    for (int64_t c = 0; c < b.cols; ++c) b.set(r, c, d(rng()));
}
// Poison: NaN everywhere (padding included), so unwritten outputs fail the comparison.
inline void poison(Buf& b) {
  for (int64_t i = 0; i < static_cast<int64_t>(b.host.size() / liger::dt_size(b.dt)); ++i)
    liger::host::store(b.host.data(), b.dt, i, NAN);
}

struct Tol {
  double atol, rtol;
};
// One-to-two units in the last place of the output dtype, plus a small absolute floor.
inline Tol tol_for(Dt dt) {
  switch (dt) {
    case Dt::F32:
      return {1e-6, 2e-5};
    case Dt::BF16:
      return {1e-3, 8e-3};  // bf16 ulp is 2^-8..2^-7 relative; Liger's tests use 1e-2
    default:
      return {1e-4, 1e-3};
  }
}

// Compares `out` (a dtype buffer) against a double reference laid out [rows][cols].
inline ::testing::AssertionResult close(const Buf& out, const std::vector<double>& ref, Tol tol,
                                        const std::string& what) {
  double worst = 0;
  int64_t bad = 0;
  std::string first;
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t c = 0; c < out.cols; ++c) {
      const double want = liger::host::round_to(out.dt, static_cast<float>(ref[r * out.cols + c]));
      const double got = out.get(r, c);
      const double err = std::fabs(got - want), lim = tol.atol + tol.rtol * std::fabs(want);
      if (!(err <= lim)) {
        if (bad++ == 0)
          first = "[" + std::to_string(r) + "," + std::to_string(c) + "] got " +
                  std::to_string(got) + " want " + std::to_string(want);
      }
      if (err > worst) worst = err;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << " (" << dt_name(out.dt) << "): " << bad << " mismatches, first " << first
         << ", worst abs err " << worst;
}

inline ::testing::AssertionResult close_f(const std::vector<float>& got,
                                          const std::vector<double>& ref, Tol tol,
                                          const std::string& what) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    if (!(err <= tol.atol + tol.rtol * std::fabs(ref[i])))
      return ::testing::AssertionFailure()
             << what << "[" << i << "] got " << got[i] << " want " << ref[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace liger_test
