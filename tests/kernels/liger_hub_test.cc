// tests/kernels/liger_hub_test.cc — the liger kernels as users get them: loaded from the embedded
// hub (<build>/hub, published by the build) through hk::load_kernel_library and called through
// the C ABI with hk tensors, per layer interface. Compiled twice: the cpu variant (CI) and, with
// LIGER_HUB_CUDA, the cuda variant (label gpu). Numbers are checked against the double references;
// the exhaustive dtype × shape sweeps live in liger_cases.inc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <tuple>

#include "hk/error.h"
#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hk/tensor.h"
#include "liger_reference.h"

#ifdef LIGER_HUB_CUDA
#include <cuda_runtime.h>

#include "common/cuda_graph_testing.h"
#endif

namespace {

namespace fs = std::filesystem;
using hk::DType;
using hk::Tensor;
using liger_test::ref::M;

#ifdef LIGER_HUB_CUDA
const char* kBackendTag = "-cu";
hk::Device dev() {
  return hk::Device::cuda(0);
}
#else
const char* kBackendTag = "-cpu-";
hk::Device dev() {
  return hk::Device::cpu();
}
#endif

// <hub>/<repo>/<commit of refs/heads/branch>/build/<variant with kBackendTag>/lib*.so
fs::path library_path(const std::string& repo, const std::string& branch) {
  const char* bin = std::getenv("HK_BINARY_DIR");
  const fs::path hub = fs::path(bin ? bin : ".") / "hub";
  std::ifstream ref(hub / repo / "refs" / "heads" / branch);
  std::string commit;
  ref >> commit;
  const fs::path build = hub / repo / commit / "build";
  if (fs::is_directory(build))
    for (const auto& v : fs::directory_iterator(build))
      if (v.path().filename().string().find(kBackendTag) != std::string::npos)
        for (const auto& f : fs::directory_iterator(v.path()))
          if (f.path().extension() == ".so") return f.path();
  ADD_FAILURE() << "no " << kBackendTag << " build of " << repo << "@" << branch << " in " << hub;
  return {};
}

hk::KernelFunction entry(const std::string& repo, const std::string& branch,
                         const std::string& name) {
  static std::map<std::string, std::shared_ptr<const hk::KernelLibrary>> loaded;
  auto& lib = loaded[repo];
  if (!lib) lib = hk::load_kernel_library(library_path(repo, branch), repo + "@" + branch);
  const std::string device = dev().is_cuda() ? "cuda" : "cpu";
  for (const auto& e : lib->entries())
    if (e.name == name && e.device == device) return hk::KernelFunction(lib, &e);
  ADD_FAILURE() << name << " not found in " << repo;
  return {};
}
hk::KernelFunction liger(const std::string& name) {
  return entry("kernels-community/liger-kernels", "v3", name);
}

std::mt19937& rng() {
  static std::mt19937 g(7);
  return g;
}
// A random tensor in `dt` on the device, and its values (rounded to dt) as doubles.
Tensor randn(const hk::Shape& shape, DType dt, M* values, float scale = 1.0f, float mean = 0.0f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng());
  Tensor t = Tensor::from_floats(v, shape, dt);
  if (values) *values = t.to_doubles();
  return t.to(dev());
}
Tensor empty(const hk::Shape& shape, DType dt) {
  return Tensor::empty(shape, dt, dev());
}
std::vector<double> host(const Tensor& t) {
  return t.to(hk::Device::cpu()).to_doubles();
}
Tensor workspace(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes > 0 ? bytes : 1)}, DType::U8, dev());
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double atol,
                  double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "] got " << got[i] << " want " << want[i];
}

// Double reference of linear + cross-entropy (no bias) for labels `lab` (-100 ignored): the summed
// loss and, for an upstream gradient of 1/div, d(x) and d(weight). `round_to`, when given, is the
// dtype the kernels hold the logits and their gradient in (each is rounded to it).
struct FlceReference {
  double total = 0;
  std::vector<double> dx, dw;
};
FlceReference flce_reference(const M& xv, const M& wv, const std::vector<int64_t>& lab, int64_t h,
                             int64_t v, double div, const liger::Dt* round_to) {
  const int64_t n = static_cast<int64_t>(lab.size());
  auto held = [&](double value) {
    return round_to ? liger_test::ref::rnd(*round_to, value) : value;
  };
  FlceReference r;
  r.dx.assign(n * h, 0);
  r.dw.assign(v * h, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (lab[i] == -100) continue;
    M z(v);
    for (int64_t j = 0; j < v; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < h; ++k) acc += xv[i * h + k] * wv[j * h + k];
      z[j] = held(acc);
    }
    auto row = liger_test::ref::ce_row(z, lab[i], {});
    r.total += row.loss;
    for (int64_t j = 0; j < v; ++j) {
      const double g = held(row.grad[j] / div);
      for (int64_t k = 0; k < h; ++k) {
        r.dx[i * h + k] += g * wv[j * h + k];
        r.dw[j * h + k] += g * xv[i * h + k];
      }
    }
  }
  return r;
}

TEST(LigerHub, TablesDeclareInterfacesAndHonestModes) {
  const auto path = library_path("kernels-community/liger-kernels", "v3");
  auto lib = hk::load_kernel_library(path, "kernels-community/liger-kernels@v3");
  EXPECT_EQ(lib->repo(), "kernels-community/liger-kernels");
  EXPECT_EQ(lib->version().substr(0, 2), "3.");
  const std::map<std::string, std::string> want = {
      {"LigerRMSNorm", "rms_norm@1"},
      {"LigerLayerNorm", "layer_norm@1"},
      {"LigerRope", "rotary_pos_emb@1"},
      {"LigerCrossEntropyLoss", "cross_entropy@1"},
      {"LigerFusedLinearCrossEntropyLoss", "fused_linear_cross_entropy@1"},
      {"LigerForCausalLMLoss", "causal_lm_loss@1"},
      {"LigerForCausalLMLossLayer", "causal_lm_loss@1"},
      {"LigerSwiGLUMLP", "mlp@1"},
      {"LigerGEGLUMLP", "mlp@1"},
      {"LigerLinear", "linear@1"},
      {"LigerRMSNormSwiGLUMLP", "rms_norm_mlp@1"}};
  for (const auto& [name, iface] : want) {
    const auto* e = lib->find_entry(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->interface_id(), iface);
    EXPECT_TRUE(e->supports_mode(hk::kKernelModeTraining)) << name;
    EXPECT_TRUE(e->has_backward) << name;
    const bool capture = e->supports_mode(hk::kKernelModeCapture);
    // Capture only on cuda, and never for the entries that create a cuBLASLt handle.
    const bool gemm = name == "LigerFusedLinearCrossEntropyLoss" || name == "LigerLinear" ||
                      name.find("MLP") != std::string::npos;
    EXPECT_EQ(capture, dev().is_cuda() && !gemm) << name;
  }
}

TEST(LigerHub, RmsNormForwardBackwardThroughTheAbi) {
  const int64_t b = 3, s = 5, h = 129, rows = b * s;
  M xv, wv, dyv;
  Tensor x = randn({b, s, h}, DType::BF16, &xv, 1.5f);
  Tensor w = randn({h}, DType::BF16, &wv, 0.2f, 1.0f);
  Tensor dy = randn({b, s, h}, DType::BF16, &dyv);
  Tensor y = empty({b, s, h}, DType::BF16), rstd = empty({rows}, DType::F32);
  Tensor dx = empty({b, s, h}, DType::BF16), dw = empty({h}, DType::F32);
  auto fn = liger("LigerRMSNorm");
  hk::RmsNormAttrs at;
  at.eps = 1e-6f;
  fn.forward({x, w}, {y, rstd}, at);
  const auto rs = host(rstd);
  std::vector<float> rs_f(rs.begin(), rs.end());
  auto ro = liger_test::ref::rms_fwd(xv, rows, h, wv, 1e-6, 0, true, liger::Dt::BF16, &rs_f);
  expect_close(host(y), ro.y, 1e-3, 8e-3, "y");
  expect_close(rs, ro.rstd, 0, 1e-5, "rstd");
  const size_t ws = fn.workspace_size(true, {dy, x, w, rstd}, {dx, dw}, &at, sizeof(at));
  Tensor wsp = workspace(ws);
  hk::KernelCallOptions opt;
  opt.workspace = wsp.view().ptr(), opt.workspace_size = ws;
  fn.backward({dy, x, w, rstd}, {dx, dw}, at, opt);
  M rdx;
  std::vector<double> rdw;
  liger_test::ref::rms_bwd(dyv, xv, rows, h, wv, 1e-6, 0, true, liger::Dt::BF16, &rdx, &rdw, &rs_f);
  expect_close(host(dx), rdx, 1e-3, 8e-3, "dx");
  expect_close(host(dw), rdw, 5e-3, 1e-4, "dweight");
  if (ws > 0) {  // too little workspace is refused with a sentence, not a crash
    opt.workspace_size = ws - 1;
    EXPECT_THROW(fn.backward({dy, x, w, rstd}, {dx, dw}, at, opt), hk::InvalidArgument);
  }
  Tensor xi = Tensor::from_ints(std::vector<int64_t>(6, 1), {2, 3}, DType::I32).to(dev());
  Tensor yi = empty({2, 3}, DType::I32);
  try {
    fn.forward({xi, randn({3}, DType::F32, nullptr)}, {yi}, at);
    ADD_FAILURE() << "an i32 input was accepted";
  } catch (const hk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos) << e.what();
  }
}

// Forward (loss, lse, z_loss and the in-forward d(logits) extension) and backward (dloss, lse).
TEST(LigerHub, CrossEntropyForwardBackwardThroughTheAbi) {
  const int64_t n = 17, v = 1000;
  M xv;
  Tensor logits = randn({n, v}, DType::BF16, &xv, 3.0f);
  std::vector<int64_t> lab(n);
  for (int64_t i = 0; i < n; ++i) lab[i] = i % 4 == 1 ? -100 : (i * 37) % v;
  Tensor labels = Tensor::from_ints(lab, {n}).to(dev());
  hk::CrossEntropyAttrs at;
  at.label_smoothing = 0.1f, at.lse_square_scale = 1e-4f, at.softcap = 30.0f;
  Tensor loss = empty({}, DType::F32), lse = empty({n}, DType::F32), zl = empty({}, DType::F32);
  Tensor g1 = empty({n, v}, DType::BF16), g2 = empty({n, v}, DType::BF16);
  auto fn = liger("LigerCrossEntropyLoss");
  const size_t ws =
      fn.workspace_size(false, {logits, labels}, {loss, lse, zl, g1}, &at, sizeof(at));
  Tensor wsp = workspace(ws);
  hk::KernelCallOptions opt;
  opt.workspace = wsp.view().ptr(), opt.workspace_size = ws;
  fn.forward({logits, labels}, {loss, lse, zl, g1}, at, opt);
  Tensor dloss = Tensor::from_floats({2.0f}, {}).to(dev());
  fn.backward({dloss, logits, labels, lse}, {g2}, at, opt);

  liger_test::ref::CeOpts o{0.1, 1e-4, 30.0};
  int64_t count = 0;
  double total = 0, ztotal = 0;
  std::vector<double> rg(n * v, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (lab[i] == -100) continue;
    ++count;
    auto r = liger_test::ref::ce_row(M(xv.begin() + i * v, xv.begin() + (i + 1) * v), lab[i], o);
    total += r.loss, ztotal += r.z;
    for (int64_t j = 0; j < v; ++j) rg[i * v + j] = r.grad[j];
  }
  for (auto& g : rg) g = liger_test::ref::rnd(liger::Dt::BF16, g / count);
  expect_close(host(loss), {total / count}, 1e-6, 1e-5, "loss");
  expect_close(host(zl), {ztotal / count}, 1e-7, 1e-5, "z_loss");
  expect_close(host(g1), rg, 1e-6, 8e-3, "dlogits (forward)");
  for (auto& g : rg) g *= 2;
  expect_close(host(g2), rg, 1e-6, 8e-3, "dlogits (backward, dloss = 2)");
}

// FLCE forward with the in-forward gradients, backward with dloss, both against cross-entropy on
// the materialised logits.
TEST(LigerHub, FusedLinearCrossEntropyThroughTheAbi) {
  const int64_t n = 20, h = 32, v = 300;
  M xv, wv;
  Tensor x = randn({n, h}, DType::F32, &xv), w = randn({v, h}, DType::F32, &wv, 0.3f);
  std::vector<int64_t> lab(n);
  for (int64_t i = 0; i < n; ++i) lab[i] = i % 6 == 0 ? -100 : (i * 53) % v;
  Tensor labels = Tensor::from_ints(lab, {n}, DType::I32).to(dev());
  hk::FusedLinearCrossEntropyAttrs at;
  at.ce.reduction = hk::kReductionSum;
  Tensor loss = empty({1}, DType::F32), dx = empty({n, h}, DType::F32),
         dw = empty({v, h}, DType::F32);
  Tensor dx2 = empty({n, h}, DType::F32), dw2 = empty({v, h}, DType::F32);
  auto fn = liger("LigerFusedLinearCrossEntropyLoss");
  size_t ws = fn.workspace_size(false, {x, w, labels}, {loss, dx, dw}, &at, sizeof(at));
  Tensor wsp = workspace(ws);
  hk::KernelCallOptions opt;
  opt.workspace = wsp.view().ptr(), opt.workspace_size = ws;
  fn.forward({x, w, labels}, {loss, dx, dw}, at, opt);
  Tensor dloss = Tensor::from_floats({0.5f}, {1}).to(dev());
  fn.backward({dloss, x, w, labels}, {dx2, dw2}, at, opt);

  FlceReference ref = flce_reference(xv, wv, lab, h, v, 1.0, nullptr);
  const double total = ref.total;
  auto& rdx = ref.dx;
  auto& rdw = ref.dw;
  expect_close(host(loss), {total}, 1e-5, 1e-5, "loss");
  expect_close(host(dx), rdx, 1e-5, 1e-4, "dx (forward)");
  expect_close(host(dw), rdw, 1e-5, 1e-4, "dweight (forward)");
  for (auto& g : rdx) g *= 0.5;
  for (auto& g : rdw) g *= 0.5;
  expect_close(host(dx2), rdx, 1e-5, 1e-4, "dx (backward)");
  expect_close(host(dw2), rdw, 1e-5, 1e-4, "dweight (backward)");
}

TEST(LigerHub, CausalLmLossShiftsLabels) {
  const int64_t b = 2, t = 6, v = 50;
  M xv;
  Tensor logits = randn({b, t, v}, DType::F32, &xv, 2.0f);
  std::vector<int64_t> lab = {5, 7, -100, 9, 11, 13, 1, 2, 3, 4, 5, 6};
  Tensor labels = Tensor::from_ints(lab, {b, t}).to(dev());
  Tensor loss = empty({}, DType::F32), g = empty({b, t, v}, DType::F32);
  auto fn = liger("LigerForCausalLMLoss");
  hk::CausalLmLossAttrs at;
  const size_t ws = fn.workspace_size(false, {logits, labels}, {loss}, &at, sizeof(at));
  Tensor wsp = workspace(ws);
  hk::KernelCallOptions opt;
  opt.workspace = wsp.view().ptr(), opt.workspace_size = ws;
  fn.forward({logits, labels}, {loss}, at, opt);
  Tensor dloss = Tensor::from_floats({1.0f}, {}).to(dev());
  fn.backward({dloss, logits, labels}, {g}, at, opt);
  double total = 0;
  int count = 0;
  std::vector<double> rg(b * t * v, 0);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti + 1 < t; ++ti) {
      const int64_t target = lab[bi * t + ti + 1];
      if (target == -100) continue;
      const int64_t row = bi * t + ti;
      auto r =
          liger_test::ref::ce_row(M(xv.begin() + row * v, xv.begin() + (row + 1) * v), target, {});
      total += r.loss, ++count;
      for (int64_t j = 0; j < v; ++j) rg[row * v + j] = r.grad[j];
    }
  for (auto& x : rg) x /= count;
  expect_close(host(loss), {total / count}, 1e-6, 1e-5, "loss");
  expect_close(host(g), rg, 1e-7, 1e-5, "dlogits");
}

TEST(LigerHub, RotaryRepoAppliesHalfRotationToQAndK) {
  const int64_t b = 2, s = 3, hq = 4, hk_ = 2, d = 16;
  M qv, kv, cv, sv;
  Tensor q = randn({b, s, hq, d}, DType::BF16, &qv), k = randn({b, s, hk_, d}, DType::BF16, &kv);
  Tensor cs = randn({1, s, d}, DType::F32, &cv), sn = randn({1, s, d}, DType::F32, &sv);
  Tensor qo = empty({b, s, hq, d}, DType::BF16), ko = empty({b, s, hk_, d}, DType::BF16);
  auto fn = entry("kernels-community/rotary", "v1", "apply_rotary_transformers");
  fn.forward({q, k, cs, sn}, {qo, ko}, hk::RotaryAttrs{});
  auto rot = [&](const M& x, int64_t heads) {
    M out(x.size());
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t si = 0; si < s; ++si)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < d; ++c) {
            const int64_t o = ((bi * s + si) * heads + h) * d;
            const double rh = c < d / 2 ? -x[o + c + d / 2] : x[o + c - d / 2];
            out[o + c] = x[o + c] * cv[si * d + c] + rh * sv[si * d + c];
          }
    return out;
  };
  expect_close(host(qo), rot(qv, hq), 1e-3, 8e-3, "q_out");
  expect_close(host(ko), rot(kv, hk_), 1e-3, 8e-3, "k_out");
}

TEST(LigerHub, ActivationRepoSiLU) {
  M xv, dyv;
  Tensor x = randn({7, 33}, DType::F16, &xv, 2.0f), dy = randn({7, 33}, DType::F16, &dyv);
  Tensor y = empty({7, 33}, DType::F16), dx = empty({7, 33}, DType::F16);
  auto fn = entry("kernels-community/activation", "v1", "SiLU");
  fn.forward({x}, {y}, hk::SiluAttrs{});
  fn.backward({dy, x}, {dx}, hk::SiluAttrs{});
  M ry(xv.size()), rdx(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    ry[i] = liger_test::ref::act(liger::Act::SiLU, xv[i]);
    rdx[i] = dyv[i] * liger_test::ref::act_grad(liger::Act::SiLU, xv[i]);
  }
  expect_close(host(y), ry, 1e-4, 1e-3, "y");
  expect_close(host(dx), rdx, 1e-4, 1e-3, "dx");
}

TEST(LigerHub, ActivationRepoGeluFamilyAndGatedEntries) {
  struct Unary {
    const char* entry;
    liger::Act act;
    uint32_t kind;
  };
  const Unary unary[] = {{"GELU", liger::Act::GeluErf, hk::kActivationGELU},
                         {"GeluTanh", liger::Act::GeluTanh, hk::kActivationGELUTanh},
                         {"FastGELU", liger::Act::GeluTanh, hk::kActivationGELUTanh},
                         {"NewGELU", liger::Act::GeluTanh, hk::kActivationGELUTanh},
                         {"QuickGELU", liger::Act::QuickGelu, hk::kActivationQuickGELU}};
  for (const Unary& u : unary) {
    SCOPED_TRACE(u.entry);
    M xv, dyv;
    Tensor x = randn({5, 37}, DType::F32, &xv, 2.0f), dy = randn({5, 37}, DType::F32, &dyv);
    Tensor y = empty({5, 37}, DType::F32), dx = empty({5, 37}, DType::F32);
    auto fn = entry("kernels-community/activation", "v1", u.entry);
    hk::ActivationAttrs attrs;
    attrs.kind = u.kind;
    fn.forward({x}, {y}, attrs);
    fn.backward({dy, x}, {dx}, attrs);
    M ry(xv.size()), rdx(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      ry[i] = liger_test::ref::act(u.act, xv[i]);
      rdx[i] = dyv[i] * liger_test::ref::act_grad(u.act, xv[i]);
    }
    expect_close(host(y), ry, 1e-6, 1e-5, "y");
    expect_close(host(dx), rdx, 1e-5, 1e-4, "dx");
    // attrs naming another function are refused, not silently ignored
    hk::ActivationAttrs wrong;
    wrong.kind = u.kind == hk::kActivationGELU ? hk::kActivationSiLU : hk::kActivationGELU;
    EXPECT_THROW(fn.forward({x}, {y}, wrong), hk::InvalidArgument);
  }
  // Transformers' entry names for the same functions (Silu, Gelu) compute the same values.
  for (const auto& [name, act, kind] : std::vector<std::tuple<const char*, liger::Act, uint32_t>>{
           {"Silu", liger::Act::SiLU, hk::kActivationSiLU},
           {"Gelu", liger::Act::GeluErf, hk::kActivationGELU}}) {
    SCOPED_TRACE(name);
    M xv;
    Tensor x = randn({3, 41}, DType::BF16, &xv, 2.0f), y = empty({3, 41}, DType::BF16);
    hk::ActivationAttrs attrs;
    attrs.kind = kind;
    entry("kernels-community/activation", "v1", name).forward({x}, {y}, attrs);
    M ry(xv.size());
    for (size_t i = 0; i < xv.size(); ++i)
      ry[i] = liger_test::ref::rnd(liger::Dt::BF16, liger_test::ref::act(act, xv[i]));
    expect_close(host(y), ry, 1e-6, 8e-3, "y");
  }
  // gated: x = gate ‖ up in one tensor [rows, 2d]; y = round(act(gate)) · up
  const std::pair<const char*, liger::Act> gated[] = {{"silu_and_mul", liger::Act::SiLU},
                                                      {"gelu_and_mul", liger::Act::GeluErf},
                                                      {"gelu_tanh_and_mul", liger::Act::GeluTanh}};
  const uint32_t kinds[] = {hk::kActivationSiLU, hk::kActivationGELU, hk::kActivationGELUTanh};
  for (int g = 0; g < 3; ++g) {
    SCOPED_TRACE(gated[g].first);
    const int64_t rows = 6, d = 19;
    M xv, dyv;
    Tensor x = randn({rows, 2 * d}, DType::F32, &xv, 1.5f), dy = randn({rows, d}, DType::F32, &dyv);
    Tensor y = empty({rows, d}, DType::F32), dx = empty({rows, 2 * d}, DType::F32);
    auto fn = entry("kernels-community/activation", "v1", gated[g].first);
    hk::ActAndMulAttrs attrs;
    attrs.kind = kinds[g];
    fn.forward({x}, {y}, attrs);
    fn.backward({dy, x}, {dx}, attrs);
    M ry(rows * d), rdx(rows * 2 * d);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) {
        const double gt = xv[r * 2 * d + c], up = xv[r * 2 * d + d + c], gy = dyv[r * d + c];
        ry[r * d + c] = liger_test::ref::act(gated[g].second, gt) * up;
        rdx[r * 2 * d + c] = gy * up * liger_test::ref::act_grad(gated[g].second, gt);
        rdx[r * 2 * d + d + c] = gy * liger_test::ref::act(gated[g].second, gt);
      }
    expect_close(host(y), ry, 1e-6, 1e-5, "y");
    expect_close(host(dx), rdx, 1e-5, 1e-4, "dx");
  }
}

// Calls fn's forward (or backward) with the workspace the entry asks for.
template <class Attrs>
void call_with_workspace(const hk::KernelFunction& fn, bool backward,
                         const std::vector<hk::TensorView>& in,
                         const std::vector<hk::TensorView>& out, const Attrs& at) {
  const size_t ws = fn.workspace_size(backward, in, out, &at, sizeof(at));
  Tensor wsp = workspace(ws);
  hk::KernelCallOptions opt;
  opt.workspace = wsp.view().ptr(), opt.workspace_size = ws;
  if (backward) {
    fn.backward(in, out, at, opt);
  } else {
    fn.forward(in, out, at, opt);
  }
}
liger::Dt liger_dt(DType dt) {
  return dt == DType::F32 ? liger::Dt::F32 : dt == DType::BF16 ? liger::Dt::BF16 : liger::Dt::F16;
}
// dloss = 1 in the shape cross_entropy@1 gives the loss: [n] for reduction none, else [].
Tensor unit_dloss(uint32_t reduction, int64_t n) {
  if (reduction == hk::kReductionNone)
    return Tensor::from_floats(std::vector<float>(n, 1.0f), {n}).to(dev());
  return Tensor::from_floats({1.0f}, {}).to(dev());
}

// linear@1 (LigerLinear): y = x·wᵀ + b with one rounding, dx = dy·w, dw (+)= dyᵀ·x, db (+)= Σ dy
// against a double reference, over dtypes, odd shapes, with and without bias, a row-strided x
// (a column block of a wider tensor) and accumulated weight gradients.
TEST(LigerHub, LinearForwardBackwardThroughTheAbi) {
  auto fn = liger("LigerLinear");
  struct Case {
    DType dt;
    int64_t rows, k, n;
    bool bias, strided, accumulate;
  };
  for (const Case& c : {Case{DType::F32, 1, 1, 1, false, false, false},
                        Case{DType::F32, 17, 33, 65, true, false, false},
                        Case{DType::BF16, 9, 128, 31, true, true, true},
                        Case{DType::F16, 4, 57, 16, false, true, false}}) {
    SCOPED_TRACE(std::string(hk::dtype_name(c.dt)) + " rows " + std::to_string(c.rows) + " k " +
                 std::to_string(c.k) + " n " + std::to_string(c.n));
    M wide, wv, bv, dyv;
    const int64_t pad = c.strided ? 7 : 0;
    Tensor xw = randn({c.rows, c.k + pad}, c.dt, &wide);
    Tensor x = c.strided ? xw.slice(1, pad, pad + c.k) : xw;
    M xv(c.rows * c.k);
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.k; ++j) xv[i * c.k + j] = wide[i * (c.k + pad) + pad + j];
    Tensor w = randn({c.n, c.k}, c.dt, &wv, 0.3f), b = randn({c.n}, c.dt, &bv);
    Tensor y = empty({c.rows, c.n}, c.dt);
    std::vector<hk::TensorView> in{x, w};
    if (c.bias) in.push_back(b);
    call_with_workspace(fn, false, in, {y}, hk::LinearAttrs{});
    M ry(c.rows * c.n);
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = c.bias ? bv[j] : 0.0;
        for (int64_t p = 0; p < c.k; ++p) acc += xv[i * c.k + p] * wv[j * c.k + p];
        ry[i * c.n + j] = acc;
      }
    const double rtol = c.dt == DType::F32 ? 1e-5 : 1e-2;
    expect_close(host(y), ry, 1e-4 * std::sqrt(double(c.k)), rtol, "y");

    Tensor dy = randn({c.rows, c.n}, c.dt, &dyv);
    Tensor dx = empty({c.rows, c.k}, c.dt);
    M w0, b0;
    Tensor dw = randn({c.n, c.k}, DType::F32, &w0), db = randn({c.n}, DType::F32, &b0);
    hk::LinearAttrs at;
    at.flags = c.accumulate ? hk::kAccumulateWeightGrads : 0u;
    call_with_workspace(fn, true, {dy, x, w}, {dx, dw, db}, at);
    M rdx(c.rows * c.k, 0.0), rdw(c.n * c.k, 0.0), rdb(c.n, 0.0);
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        const double g = dyv[i * c.n + j];
        rdb[j] += g;
        for (int64_t p = 0; p < c.k; ++p) {
          rdx[i * c.k + p] += g * wv[j * c.k + p];
          rdw[j * c.k + p] += g * xv[i * c.k + p];
        }
      }
    if (c.accumulate) {
      for (size_t i = 0; i < rdw.size(); ++i) rdw[i] += w0[i];
      for (size_t i = 0; i < rdb.size(); ++i) rdb[i] += b0[i];
    }
    const double atol_n = 1e-4 * std::sqrt(double(c.n)), atol_r = 1e-4 * std::sqrt(double(c.rows));
    expect_close(host(dx), rdx, atol_n, rtol, "dx");
    expect_close(host(dw), rdw, atol_r, c.dt == DType::F32 ? 1e-5 : 1e-3, "dweight");
    expect_close(host(db), rdb, atol_r, c.dt == DType::F32 ? 1e-5 : 1e-3, "dbias");
  }
  // A weight that does not match x is refused with a sentence, not a crash.
  Tensor x = randn({2, 5}, DType::F32, nullptr), w = randn({3, 4}, DType::F32, nullptr);
  Tensor y = empty({2, 3}, DType::F32);
  try {
    call_with_workspace(fn, false, {x, w}, {y}, hk::LinearAttrs{});
    ADD_FAILURE() << "a [3, 4] weight for x [2, 5] was accepted";
  } catch (const hk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight must be [N, K]"), std::string::npos) << e.what();
  }
}

// rms_norm_mlp@1 (LigerRMSNormSwiGLUMLP, KernelConfig fusions): the fused entry, with its layout's
// concatenated gate_up weight, against the unfused pair the model runs without the fusion —
// LigerRMSNorm then LigerSwiGLUMLP — through the ABI, forward and backward (weight gradients
// written and accumulated), over dtypes and odd row counts; its layout as the ABI declares it.
TEST(LigerHub, RmsNormSwiGLUMLPEqualsTheUnfusedNormAndMlp) {
  auto fused = liger("LigerRMSNormSwiGLUMLP"), norm = liger("LigerRMSNorm"),
       mlp = liger("LigerSwiGLUMLP");
  const hk_layout* layout = fused.entry().raw->layout;
  ASSERT_NE(layout, nullptr);
  EXPECT_STREQ(layout->name, "LigerRMSNormSwiGLUMLPLayout");
  ASSERT_EQ(layout->num_parameters, 3u);
  EXPECT_STREQ(layout->parameters[1], "mlp.gate_up_proj.weight");
  EXPECT_EQ(layout->conversions[0].op, HK_CONVERT_CONCAT);
  struct Case {
    DType dt;
    int64_t rows, h, inter;
    bool accumulate;
  };
  for (const Case& c :
       {Case{DType::F32, 8, 40, 24, false}, Case{DType::BF16, 15, 72, 40, true},
        Case{DType::F16, 1, 64, 128, false}, Case{DType::BF16, 32, 128, 96, false}}) {
    SCOPED_TRACE(std::string(hk::dtype_name(c.dt)) + " rows " + std::to_string(c.rows));
    const int64_t r = c.rows, h = c.h, in = c.inter;
    M gv, uv;
    Tensor x = randn({r, h}, c.dt, nullptr, 1.5f), w = randn({h}, c.dt, nullptr, 0.2f, 1.0f);
    Tensor gate = randn({in, h}, c.dt, &gv, 0.2f), up = randn({in, h}, c.dt, &uv, 0.2f);
    Tensor down = randn({h, in}, c.dt, nullptr, 0.2f), dy = randn({r, h}, c.dt, nullptr);
    std::vector<float> cat(gv.begin(), gv.end());
    cat.insert(cat.end(), uv.begin(), uv.end());
    Tensor gate_up = Tensor::from_floats(cat, {2 * in, h}, c.dt).to(dev());
    hk::RmsNormMlpAttrs fa;
    fa.eps = 1e-6f;
    fa.activation = hk::kActivationSiLU;
    fa.flags = c.accumulate ? hk::kAccumulateWeightGrads : 0u;
    hk::RmsNormAttrs na;
    na.eps = 1e-6f;
    na.flags = fa.flags;
    hk::MlpAttrs ma;
    ma.activation = hk::kActivationSiLU;
    ma.flags = fa.flags;

    // The unfused pair LigerRMSNorm → LigerSwiGLUMLP at dtype `dt` over the same values, forward
    // and backward (weight gradients from the same starting values when accumulating).
    M w0, gu0, d0;
    Tensor dw = randn({h}, DType::F32, &w0), dgu = randn({2 * in, h}, DType::F32, &gu0),
           ddown = randn({h, in}, DType::F32, &d0);
    auto floats = [](const std::vector<double>& v) {
      return std::vector<float>(v.begin(), v.end());
    };
    struct PairResult {
      std::vector<double> y, rstd, gate, up, dx, dw, dgate_up, ddown;
    };
    auto pair = [&](DType dt) {
      auto as = [&](const Tensor& t) {
        return Tensor::from_floats(floats(host(t)), t.sizes(), dt).to(dev());
      };
      Tensor xs = as(x), ws = as(w), gs = as(gate), us = as(up), ds = as(down), dys = as(dy);
      Tensor n = empty({r, h}, dt), ry = empty({r, h}, dt), rrstd = empty({r}, DType::F32);
      Tensor g = empty({r, in}, dt), u = empty({r, in}, dt);
      call_with_workspace(norm, false, {xs, ws}, {n, rrstd}, na);
      call_with_workspace(mlp, false, {n, gs, us, ds}, {ry, g, u}, ma);
      std::vector<float> g0(gu0.begin(), gu0.begin() + in * h), u0(gu0.begin() + in * h, gu0.end());
      Tensor rdgate = Tensor::from_floats(g0, {in, h}, DType::F32).to(dev());
      Tensor rdup = Tensor::from_floats(u0, {in, h}, DType::F32).to(dev());
      Tensor rdw = Tensor::from_floats(floats(w0), {h}, DType::F32).to(dev());
      Tensor rddown = Tensor::from_floats(floats(d0), {h, in}, DType::F32).to(dev());
      Tensor dn = empty({r, h}, dt), rdx = empty({r, h}, dt);
      call_with_workspace(mlp, true, {dys, n, gs, us, ds}, {dn, rdgate, rdup, rddown}, ma);
      call_with_workspace(norm, true, {dn, xs, ws, rrstd}, {rdx, rdw}, na);
      PairResult p{host(ry),  host(rrstd), host(g),      host(u),
                   host(rdx), host(rdw),   host(rdgate), host(rddown)};
      const std::vector<double> dup = host(rdup);
      p.dgate_up.insert(p.dgate_up.end(), dup.begin(), dup.end());
      return p;
    };
    // f32 is compared with the f32 pair directly. In bf16/f16 the fused kernel rounds at other
    // points than the pair (the pair's d(norm output) goes through the dtype between its two
    // kernels), so both are compared with the pair computed in f32 over the same values: the
    // fused kernel must be no further from it than twice the pair's own distance (plus 1e-3).
    const PairResult ref = pair(DType::F32);
    const bool half = c.dt != DType::F32;
    const PairResult same = half ? pair(c.dt) : ref;
    auto expect_as_close = [&](const std::vector<double>& got, const std::vector<double>& want,
                               const std::vector<double>& pair_got, const std::string& what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      double scale = 0.0, err = 0.0, pair_err = 0.0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        err = std::max(err, std::fabs(got[i] - want[i]));
        pair_err = std::max(pair_err, std::fabs(pair_got[i] - want[i]));
      }
      if (!half) {
        expect_close(got, want, 1e-5, 1e-5, what);
        return;
      }
      EXPECT_LE(err / scale, 2.0 * pair_err / scale + 1e-3)
          << what << ": fused max error " << err << ", the unfused pair's " << pair_err
          << " (max |value| " << scale << ")";
    };

    // forward; every other case keeps the pre-activations (a training forward), which backward
    // then reads
    const bool keep = c.rows % 2 == 1;
    Tensor y = empty({r, h}, c.dt), rstd = empty({r}, DType::F32), kept = empty({r, 2 * in}, c.dt);
    std::vector<hk::TensorView> fwd_out{y, rstd};
    if (keep) fwd_out.push_back(kept);
    call_with_workspace(fused, false, {x, w, gate_up, down}, fwd_out, fa);
    expect_as_close(host(y), ref.y, same.y, "y");
    expect_close(host(rstd), same.rstd, 0, 1e-6, "rstd");
    if (keep) {  // gu = n·gate_upᵀ: the pair's gate and up side by side
      auto side_by_side = [&](const PairResult& p) {
        std::vector<double> v(static_cast<size_t>(r * 2 * in));
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < in; ++j) {
            v[i * 2 * in + j] = p.gate[i * in + j];
            v[i * 2 * in + in + j] = p.up[i * in + j];
          }
        return v;
      };
      expect_as_close(host(kept), side_by_side(ref), side_by_side(same), "kept gate_up");
    }

    // backward
    Tensor dx = empty({r, h}, c.dt);
    std::vector<hk::TensorView> bwd_in{dy, x, w, gate_up, down, rstd};
    if (keep) bwd_in.push_back(kept);
    call_with_workspace(fused, true, bwd_in, {dx, dw, dgu, ddown}, fa);
    expect_as_close(host(dx), ref.dx, same.dx, "dx");
    expect_as_close(host(dw), ref.dw, same.dw, "dnorm_w");
    expect_as_close(host(dgu), ref.dgate_up, same.dgate_up, "dgate_up");
    expect_as_close(host(ddown), ref.ddown, same.ddown, "ddown");
  }
  // gate_up that is not [2I, H] for down [H, I] is refused with a sentence
  Tensor x = randn({2, 8}, DType::F32, nullptr), w = randn({8}, DType::F32, nullptr);
  Tensor gu = randn({6, 8}, DType::F32, nullptr), down = randn({8, 4}, DType::F32, nullptr);
  Tensor y = empty({2, 8}, DType::F32);
  try {
    call_with_workspace(fused, false, {x, w, gu, down}, {y}, hk::RmsNormMlpAttrs{});
    ADD_FAILURE() << "a [6, 8] gate_up for down [8, 4] was accepted";
  } catch (const hk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_up_w [2I, H]"), std::string::npos) << e.what();
  }
}

// rms_norm@1 casting mode 2 ("none"): y = round(x·r·(offset + w)) in f32, one rounding — the
// documented formula against the double reference, forward and backward, with an offset; the
// same values as gemma; an undefined mode refused.
TEST(LigerHub, RmsNormCastingNoneIsTheF32Formula) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(hk::dtype_name(dt));
    const int64_t rows = 11, h = 257;
    const float eps = 1e-5f, offset = 1.0f;
    M xv, wv, dyv;
    Tensor x = randn({rows, h}, dt, &xv, 2.0f), w = randn({h}, dt, &wv, 0.3f);
    Tensor dy = randn({rows, h}, dt, &dyv);
    Tensor y = empty({rows, h}, dt), rstd = empty({rows}, DType::F32);
    Tensor dx = empty({rows, h}, dt), dw = empty({h}, DType::F32);
    auto fn = liger("LigerRMSNorm");
    hk::RmsNormAttrs at;
    at.eps = eps, at.offset = offset, at.casting_mode = hk::kRmsNormCastingNone;
    call_with_workspace(fn, false, {x, w}, {y, rstd}, at);
    call_with_workspace(fn, true, {dy, x, w, rstd}, {dx, dw}, at);

    const liger::Dt ldt = liger_dt(dt);
    auto ro = liger_test::ref::rms_fwd(xv, rows, h, wv, eps, offset, false, ldt);
    for (auto& v : ro.y) v = liger_test::ref::rnd(ldt, v);
    M rdx;
    std::vector<double> rdw;
    liger_test::ref::rms_bwd(dyv, xv, rows, h, wv, eps, offset, false, ldt, &rdx, &rdw);
    const bool f32 = dt == DType::F32;
    expect_close(host(y), ro.y, f32 ? 1e-6 : 1e-3, f32 ? 2e-5 : 8e-3, "y");
    expect_close(host(rstd), ro.rstd, 0, 1e-5, "rstd");
    expect_close(host(dx), rdx, f32 ? 1e-6 : 1e-3, f32 ? 2e-5 : 8e-3, "dx");
    expect_close(host(dw), rdw, 1e-5, 1e-4, "dweight");

    // Gemma casting computes the same values (the header's claim).
    hk::RmsNormAttrs gemma = at;
    gemma.casting_mode = hk::kRmsNormCastingGemma;
    Tensor yg = empty({rows, h}, dt), dxg = empty({rows, h}, dt), dwg = empty({h}, DType::F32);
    call_with_workspace(fn, false, {x, w}, {yg}, gemma);
    call_with_workspace(fn, true, {dy, x, w, rstd}, {dxg, dwg}, gemma);
    EXPECT_EQ(host(yg), host(y));
    EXPECT_EQ(host(dxg), host(dx));
    expect_close(host(dwg), host(dw), 0, 1e-6, "dweight (gemma)");

    hk::RmsNormAttrs bad = at;
    bad.casting_mode = 3;
    EXPECT_THROW(call_with_workspace(fn, false, {x, w}, {y, rstd}, bad), hk::InvalidArgument);
    EXPECT_THROW(call_with_workspace(fn, true, {dy, x, w, rstd}, {dx, dw}, bad),
                 hk::InvalidArgument);
  }
}

// cross_entropy@1's optional forward output dlogits (index 3): the gradient for dloss = 1, into a
// buffer of its own and in place over the logits, equal to forward + backward with dloss = 1 and
// to the reference; ignored rows get zeros.
TEST(LigerHub, CrossEntropyForwardWritesTheGradientForUnitDloss) {
  for (DType dt : {DType::F32, DType::BF16})
    for (uint32_t red : {hk::kReductionMean, hk::kReductionSum, hk::kReductionNone}) {
      SCOPED_TRACE(std::string(hk::dtype_name(dt)) + " reduction " + std::to_string(red));
      const int64_t n = 13, v = 517;
      M xv;
      Tensor logits = randn({n, v}, dt, &xv, 3.0f);
      std::vector<int64_t> lab(n);
      std::uniform_int_distribution<int64_t> pick(0, v - 1);
      for (int64_t i = 0; i < n; ++i) lab[i] = i == 2 || i == 9 ? -100 : pick(rng());
      Tensor labels = Tensor::from_ints(lab, {n}).to(dev());
      hk::CrossEntropyAttrs at;
      at.reduction = red, at.label_smoothing = 0.05f, at.lse_square_scale = 1e-4f;
      at.softcap = 25.0f;
      const hk::Shape loss_shape = red == hk::kReductionNone ? hk::Shape{n} : hk::Shape{};
      auto fn = liger("LigerCrossEntropyLoss");

      // (1) forward with its own dlogits buffer
      Tensor loss1 = empty(loss_shape, DType::F32), g1 = empty({n, v}, dt);
      call_with_workspace(fn, false, {logits, labels},
                          {loss1, hk::TensorView{}, hk::TensorView{}, g1}, at);
      // (2) forward in place: dlogits is the logits tensor
      Tensor inplace = logits.clone(), loss2 = empty(loss_shape, DType::F32);
      call_with_workspace(fn, false, {inplace, labels},
                          {loss2, hk::TensorView{}, hk::TensorView{}, inplace}, at);
      // (3) forward, then backward with dloss = 1
      Tensor loss3 = empty(loss_shape, DType::F32), lse = empty({n}, DType::F32);
      Tensor g3 = empty({n, v}, dt);
      call_with_workspace(fn, false, {logits, labels}, {loss3, lse}, at);
      call_with_workspace(fn, true, {unit_dloss(red, n), logits, labels, lse}, {g3}, at);

      const bool f32 = dt == DType::F32;
      const double atol = f32 ? 1e-7 : 1e-6, rtol = f32 ? 1e-5 : 8e-3;
      const auto gb = host(g3);
      expect_close(host(g1), gb, atol, rtol, "dlogits (forward) vs backward");
      expect_close(host(inplace), gb, atol, rtol, "dlogits (forward, in place) vs backward");
      expect_close(host(loss1), host(loss3), 1e-6, 1e-5, "loss with dlogits vs without");
      expect_close(host(loss2), host(loss3), 1e-6, 1e-5, "loss in place vs without");

      liger_test::ref::CeOpts o{0.05, 1e-4, 25.0};
      int64_t count = 0;
      for (int64_t t : lab) count += t != -100;
      const double div = red == hk::kReductionMean ? count : 1;
      std::vector<double> rloss(n, 0), rg(n * v, 0);
      for (int64_t i = 0; i < n; ++i) {
        if (lab[i] == -100) continue;
        auto r =
            liger_test::ref::ce_row(M(xv.begin() + i * v, xv.begin() + (i + 1) * v), lab[i], o);
        rloss[i] = r.loss;
        for (int64_t j = 0; j < v; ++j)
          rg[i * v + j] = liger_test::ref::rnd(liger_dt(dt), r.grad[j] / div);
      }
      expect_close(host(g1), rg, atol, rtol, "dlogits (forward) vs reference");
      if (red == hk::kReductionNone) {
        expect_close(host(loss1), rloss, 1e-6, 1e-5, "loss");
      } else {
        double s = 0;
        for (double l : rloss) s += l;
        expect_close(host(loss1), {s / div}, 1e-6, 1e-5, "loss");
      }
      const auto g1h = host(g1);
      for (int64_t i : {2, 9})
        for (int64_t j = 0; j < v; ++j)
          ASSERT_EQ(g1h[i * v + j], 0.0) << "ignored row " << i << " has a gradient";
    }
}

// fused_linear_cross_entropy@1's optional forward outputs dx, dweight (indices 1, 2): the
// gradients for dloss = 1 from the forward equal the backward's at dloss = 1 (dweight in f32 and
// in the weight's 16-bit dtype) and the reference on materialised logits; dbias is refused.
TEST(LigerHub, FusedLinearCrossEntropyForwardGradientsEqualBackwardAtUnitDloss) {
  struct Case {
    DType dt, wgrad;
  };
  for (Case c : {Case{DType::F32, DType::F32}, Case{DType::BF16, DType::F32},
                 Case{DType::BF16, DType::BF16}})
    for (uint32_t red : {hk::kReductionMean, hk::kReductionSum}) {
      SCOPED_TRACE(std::string(hk::dtype_name(c.dt)) + " dweight " + hk::dtype_name(c.wgrad) +
                   " reduction " + std::to_string(red));
      const int64_t n = 29, h = 64, v = 1000;
      M xv, wv;
      Tensor x = randn({n, h}, c.dt, &xv), w = randn({v, h}, c.dt, &wv, 0.3f);
      std::vector<int64_t> lab(n);
      std::uniform_int_distribution<int64_t> pick(0, v - 1);
      for (int64_t i = 0; i < n; ++i) lab[i] = i % 7 == 3 ? -100 : pick(rng());
      Tensor labels = Tensor::from_ints(lab, {n}, DType::I32).to(dev());
      hk::FusedLinearCrossEntropyAttrs at;
      at.ce.reduction = red;
      auto fn = liger("LigerFusedLinearCrossEntropyLoss");
      Tensor loss = empty({}, DType::F32), dx = empty({n, h}, c.dt), dw = empty({v, h}, c.wgrad);
      call_with_workspace(fn, false, {x, w, labels}, {loss, dx, dw}, at);
      Tensor dx2 = empty({n, h}, c.dt), dw2 = empty({v, h}, c.wgrad);
      call_with_workspace(fn, true, {unit_dloss(red, n), x, w, labels}, {dx2, dw2}, at);

      const bool f32 = c.dt == DType::F32;
      const double atol = f32 ? 1e-6 : 1e-3, rtol = f32 ? 1e-5 : 8e-3;
      expect_close(host(dx), host(dx2), atol, rtol, "dx (forward) vs backward");
      expect_close(host(dw), host(dw2), atol, rtol, "dweight (forward) vs backward");

      // Reference: logits and their gradient held in x's dtype (as the kernels' GEMMs hold them).
      const liger::Dt ldt = liger_dt(c.dt);
      int64_t count = 0;
      for (int64_t t : lab) count += t != -100;
      const double div = red == hk::kReductionMean ? count : 1;
      FlceReference ref = flce_reference(xv, wv, lab, h, v, div, &ldt);
      const double total = ref.total;
      auto& rdx = ref.dx;
      auto& rdw = ref.dw;
      if (c.wgrad != DType::F32)
        for (auto& g : rdw) g = liger_test::ref::rnd(liger_dt(c.wgrad), g);
      const double gatol = f32 ? 1e-6 : 2e-3, grtol = f32 ? 1e-4 : 2e-2;
      expect_close(host(loss), {total / div}, f32 ? 1e-5 : 2e-3, f32 ? 1e-5 : 2e-3, "loss");
      expect_close(host(dx), rdx, gatol, grtol, "dx (forward) vs reference");
      expect_close(host(dw), rdw, gatol, grtol, "dweight (forward) vs reference");

      // kAccumulateWeightGrads: the forward's dweight is added to what is there.
      if (c.wgrad == DType::F32) {
        hk::FusedLinearCrossEntropyAttrs acc = at;
        acc.flags = hk::kAccumulateWeightGrads;
        Tensor dw3 = Tensor::from_floats(std::vector<float>(v * h, 0.5f), {v, h}).to(dev());
        call_with_workspace(fn, false, {x, w, labels},
                            {empty({}, DType::F32), hk::TensorView{}, dw3}, acc);
        auto want = host(dw);
        for (auto& g : want) g += 0.5;
        expect_close(host(dw3), want, 1e-6, 1e-6, "dweight accumulated");
      }

      // dbias (forward output 3) is not implemented: refused with a sentence naming it.
      Tensor db = empty({v}, DType::F32);
      try {
        call_with_workspace(fn, false, {x, w, labels}, {loss, dx, dw, db}, at);
        ADD_FAILURE() << "a dbias output was accepted";
      } catch (const hk::Unsupported& e) {
        EXPECT_NE(std::string(e.what()).find("dbias"), std::string::npos) << e.what();
      }
    }
}

#ifdef LIGER_HUB_CUDA
// The Capture claim, checked: RMSNorm forward + backward and cross-entropy forward + backward
// recorded into one CUDA graph (workspace preallocated), replayed on fresh inputs copied into the
// same buffers, equal bit for bit to the eager calls.
TEST(LigerHub, CaptureEntriesRecordIntoACudaGraph) {
  const int64_t rows = 64, h = 1024, v = 4096;
  M xv, wv, dyv, lv;
  Tensor x = randn({rows, h}, DType::BF16, &xv), w = randn({h}, DType::BF16, &wv, 0.2f, 1.0f);
  Tensor dy = randn({rows, h}, DType::BF16, &dyv), logits = randn({rows, v}, DType::BF16, &lv, 3.f);
  std::vector<int64_t> lab(rows);
  for (int64_t i = 0; i < rows; ++i) lab[i] = i % 7 == 3 ? -100 : (i * 131) % v;
  Tensor labels = Tensor::from_ints(lab, {rows}).to(dev());
  Tensor dloss = Tensor::from_floats({1.5f}, {}).to(dev());
  Tensor y = empty({rows, h}, DType::BF16), rstd = empty({rows}, DType::F32);
  Tensor dx = empty({rows, h}, DType::BF16), dw = empty({h}, DType::F32);
  Tensor loss = empty({}, DType::F32), lse = empty({rows}, DType::F32);
  Tensor g = empty({rows, v}, DType::BF16);
  auto rms = liger("LigerRMSNorm");
  auto ce = liger("LigerCrossEntropyLoss");
  hk::RmsNormAttrs ra;
  hk::CrossEntropyAttrs ca;
  ca.label_smoothing = 0.05f;
  const size_t ws_rms = rms.workspace_size(true, {dy, x, w, rstd}, {dx, dw}, &ra, sizeof(ra));
  const size_t ws_ce =
      std::max(ce.workspace_size(false, {logits, labels}, {loss, lse}, &ca, sizeof(ca)),
               ce.workspace_size(true, {dloss, logits, labels, lse}, {g}, &ca, sizeof(ca)));
  Tensor w1 = workspace(ws_rms), w2 = workspace(ws_ce);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  hk::KernelCallOptions o1, o2;
  o1.stream.handle = o2.stream.handle = stream;
  o1.workspace = w1.view().ptr(), o1.workspace_size = ws_rms;
  o2.workspace = w2.view().ptr(), o2.workspace_size = ws_ce;
  auto step = [&] {
    rms.forward({x, w}, {y, rstd}, ra, o1);
    rms.backward({dy, x, w, rstd}, {dx, dw}, ra, o1);
    ce.forward({logits, labels}, {loss, lse}, ca, o2);
    ce.backward({dloss, logits, labels, lse}, {g}, ca, o2);
  };
  step();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto eager =
      std::vector<std::vector<double>>{host(y), host(dx), host(dw), host(loss), host(g)};
  // Poison the outputs, capture, replay.
  for (const Tensor* t : {&y, &dx, &dw, &loss, &g})
    ASSERT_EQ(cudaMemset(t->view().ptr(), 0xff, t->nbytes()), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(hk::testing::capture_and_replay(stream, step));
  const auto replay =
      std::vector<std::vector<double>>{host(y), host(dx), host(dw), host(loss), host(g)};
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(eager[i], replay[i]) << "output " << i;
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
