// my_rmsnorm_check — calls the published someorg/my-rmsnorm through hk's hub and loader.
//
// A host program built against the installed hk (hk::hk), run by tests/sdk/run_sdk_test.cmake
// with HK_HUB_DIR pointing at this project's hub. It checks that an org outside the trusted ones
// is refused without trust_remote_code, then resolves the v0.1.0 tag with trust, verifies digests
// and loads the library (Hub::load), calls MyRMSNorm and compares y and rstd with hk's own
// hk::ops::rms_norm on the same input. It prints one line per step; exit 0 = all good, 1 = a
// mismatch or an hk::Error (its sentence is printed).
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hk/ops.h"
#include "hk/tensor.h"

namespace {

constexpr const char* kSpec = "someorg/my-rmsnorm@v0.1.0:MyRMSNorm";

bool untrusted_is_refused(hk::hub::Hub& hub, const hk::hub::Target& target) {
  try {
    hub.resolve(kSpec, target);
  } catch (const hk::InvalidArgument& e) {
    const bool ok = std::string(e.what()).find("trusted org") != std::string::npos;
    std::printf("untrusted: %s (%s)\n", ok ? "refused" : "refused for another reason", e.what());
    return ok;
  }
  std::printf("untrusted: loaded without trust_remote_code (should have been refused)\n");
  return false;
}

bool matches_builtin(const hk::KernelFunction& fn) {
  const int64_t rows = 5, hidden = 48;
  std::vector<float> x_values(rows * hidden), w_values(hidden);
  for (int64_t i = 0; i < rows * hidden; ++i) x_values[i] = std::sin(0.37f * i) * (1 + i % 7);
  for (int64_t j = 0; j < hidden; ++j) w_values[j] = 0.5f + 0.03f * j;
  hk::Tensor x = hk::Tensor::from_floats(x_values, {rows, hidden});
  hk::Tensor w = hk::Tensor::from_floats(w_values, {hidden});
  hk::Tensor y = hk::Tensor::zeros({rows, hidden}, hk::DType::F32);
  hk::Tensor rstd = hk::Tensor::zeros({rows}, hk::DType::F32);
  hk::Tensor y_ref = hk::Tensor::zeros({rows, hidden}, hk::DType::F32);
  hk::Tensor rstd_ref = hk::Tensor::zeros({rows}, hk::DType::F32);

  hk::RmsNormAttrs attrs;
  attrs.eps = 1e-5f;
  fn.forward({x, w}, {y, rstd}, attrs);
  hk::ops::rms_norm(x, w, attrs.eps, y_ref, &rstd_ref.view());

  float worst = 0.0f;
  auto compare = [&](const hk::Tensor& got, const hk::Tensor& want) {
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float a = got.data_as<float>()[i], b = want.data_as<float>()[i];
      const float err = std::fabs(a - b) / (1e-6f + std::fabs(b));
      if (!(err <= worst)) worst = err;  // NaN counts as worst
    }
  };
  compare(y, y_ref);
  compare(rstd, rstd_ref);
  const bool ok = worst <= 1e-5f;
  std::printf("forward: %s (max relative difference to hk::ops::rms_norm %.3g)\n",
              ok ? "matches" : "DIFFERS", worst);
  return ok;
}

}  // namespace

int main() {
  try {
    hk::hub::Hub hub;  // HK_HUB_DIR, HK_TRUSTED_ORGS, ... from the environment
    const auto target = hk::hub::Target::for_device(hk::Device::cpu());
    if (!untrusted_is_refused(hub, target)) return 1;

    hk::hub::ResolveOptions options;
    options.trust_remote_code = true;
    hk::hub::Resolution resolution = hub.resolve(kSpec, target, options);
    std::printf("resolved: %s commit %s variant %s\n", resolution.repo.c_str(),
                resolution.commit.c_str(), resolution.variant.c_str());
    std::shared_ptr<const hk::KernelLibrary> library = hub.load(resolution);
    if (library->repo() != "someorg/my-rmsnorm" || library->version() != "0.1.0") {
      std::printf("loaded: the table says %s %s\n", library->repo().c_str(),
                  library->version().c_str());
      return 1;
    }
    hk::KernelFunction fn = library->function("MyRMSNorm");
    std::printf("loaded: %s\n", fn.qualified_name().c_str());
    if (!matches_builtin(fn)) return 1;
    std::printf("ok\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
