// The dlopen loader against real published libraries: refusals with reasons (the process lives
// on), two versions of one repo in one process, and dlclose when the last user goes.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "hk/error.h"
#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hub_fixture.h"

namespace hk {
namespace {

using test::library_path;
using test::test_hub;

std::filesystem::path versions_lib(const std::string& ref) {
  return library_path(test_hub(), "kernels-community/rmsnorm", ref, "-cpu-", "librmsnorm.so");
}

// Runs `fn`, expects an exception of type E whose message contains every one of `needles`.
template <class E, class Fn>
void expect_refusal(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    FAIL() << "expected a refusal";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(message.find(needle), std::string::npos)
          << "'" << needle << "' not in: " << message;
  }
}

bool still_loaded(const std::filesystem::path& so) {
  void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

TEST(KernelLoader, LoadsTheEmbeddedRmsnormAndDescribesItsEntry) {
  const auto so = library_path(test::embedded_hub(), "kernels-community/rmsnorm", "heads/v1",
                               "-cpu-", "librmsnorm.so");
  ASSERT_FALSE(so.empty()) << "embedded hub not built at " << test::embedded_hub();
  auto lib = load_kernel_library(so, "kernels-community/rmsnorm@v1");
  EXPECT_EQ(lib->repo(), "kernels-community/rmsnorm");
  EXPECT_EQ(lib->abi_major(), 1u);
  ASSERT_EQ(lib->entries().size(), 1u);
  const KernelEntryInfo& e = lib->entries()[0];
  EXPECT_EQ(e.name, "RMSNorm");
  EXPECT_EQ(e.interface_id(), "rms_norm@1");
  EXPECT_EQ(e.device, "cpu");
  EXPECT_TRUE(e.has_backward);
  EXPECT_TRUE(e.supports_mode(kKernelModeInference | kKernelModeTraining));
  EXPECT_FALSE(e.supports_mode(kKernelModeCapture));
  EXPECT_TRUE(e.supports_dtype(DType::BF16));
  EXPECT_FALSE(e.supports_dtype(DType::I64));
  EXPECT_TRUE(e.supports_capability(0));
  EXPECT_EQ(kernel_mode_names(e.modes), (std::vector<std::string>{"inference", "training"}));
  EXPECT_EQ(lib->find_entry("Nope"), nullptr);
  const auto x = Tensor::from_floats({1, 2, 3}, {1, 3});
  EXPECT_EQ(lib->function("RMSNorm").workspace_size(true, {x, x, x}, {x}, nullptr, 0), 0u)
      << "the cpu entry declares no workspace";
  expect_refusal<NotFound>([&] { lib->function("Nope"); }, {"no entry 'Nope'", "RMSNorm"});
}

TEST(KernelLoader, LoadsTheCudaVariantWithoutTouchingAGpu) {
  // Loading runs no device code: a CUDA build's cuda variant loads and validates on any host.
  const auto so = library_path(test::embedded_hub(), "kernels-community/rmsnorm", "heads/v1", "-cu",
                               "librmsnorm.so");
  if (so.empty()) GTEST_SKIP() << "this build has no cuda variant";
  auto lib = load_kernel_library(so);
  ASSERT_EQ(lib->entries().size(), 1u);
  const KernelEntryInfo& e = lib->entries()[0];
  EXPECT_EQ(e.device, "cuda");
  EXPECT_TRUE(e.supports_mode(kKernelModeTraining | kKernelModeCapture));
  EXPECT_GT(e.min_capability, 0);
  EXPECT_NE(e.raw->workspace_size, nullptr);
}

TEST(KernelLoader, RefusesWrongAbiMajor) {
  const auto so =
      library_path(test_hub(), "kernels-community/wrong-abi", "heads/v1", "-cpu-", "librmsnorm.so");
  ASSERT_FALSE(so.empty());
  expect_refusal<Unsupported>(
      [&] { load_kernel_library(so, "kernels-community/wrong-abi"); },
      {"built for hk kernel ABI 2, this hk speaks 1",
       "rebuild the kernel or use a matching version", so.string(), "kernels-community/wrong-abi"});
  EXPECT_FALSE(still_loaded(so)) << "a refused library must not stay loaded";
}

TEST(KernelLoader, RefusesUnknownInterfaceVersion) {
  const auto so = library_path(test_hub(), "kernels-community/unknown-interface", "heads/v1",
                               "-cpu-", "libunknown.so");
  ASSERT_FALSE(so.empty());
  // The entry's forward aborts: reaching it would kill this test process.
  expect_refusal<Unsupported>([&] { load_kernel_library(so); },
                              {"'RMSNorm'", "rms_norm@7", "known versions: rms_norm@1"});
  EXPECT_FALSE(still_loaded(so));
}

TEST(KernelLoader, RefusesALibraryWithoutTheTableSymbol) {
  const auto so = library_path(test_hub(), "kernels-community/missing-symbol", "heads/v1", "-cpu-",
                               "libmissing.so");
  ASSERT_FALSE(so.empty());
  expect_refusal<Error>([&] { load_kernel_library(so, "kernels-community/missing-symbol"); },
                        {"hk_kernel_library_v1", so.string(), "not an hk kernel library"});
}

TEST(KernelLoader, NamesTheAbiOfALibraryFromAnotherMajor) {
  expect_refusal<Unsupported>(
      [] { load_kernel_library(HK_TEST_FUTURE_ABI_SO); },
      {"built for hk kernel ABI 2", "hk_kernel_library_v2", "this hk speaks 1"});
}

TEST(KernelLoader, LayoutsCrossTheAbiAndTheDump) {
  auto lib = load_kernel_library(HK_TEST_LAYOUT_SO);
  const KernelEntryInfo* e = lib->find_entry("FusedMLP");
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->has_layout);
  const hk_layout& layout = *e->raw->layout;
  EXPECT_STREQ(layout.name, "FusedMLPLayout");
  ASSERT_EQ(layout.num_conversions, 2u);
  EXPECT_EQ(layout.conversions[0].op, HK_CONVERT_CONCAT);
  EXPECT_STREQ(layout.conversions[0].sources[1], "up_proj.weight");

  const std::string command = std::string(HK_TEST_KERNEL_DUMP) + " " + HK_TEST_LAYOUT_SO;
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  const auto dump = nlohmann::json::parse(out);
  EXPECT_EQ(dump.at("repo"), "test/layout");
  const auto& entry = dump.at("entries").at(0);
  EXPECT_EQ(entry.at("interface"), "mlp");
  EXPECT_EQ(entry.at("backward"), false);
  EXPECT_EQ(entry.at("layout").at("name"), "FusedMLPLayout");
  EXPECT_EQ(entry.at("layout").at("parameters"),
            nlohmann::json::array({"gate_up_proj.weight", "down_proj.weight"}));
  EXPECT_EQ(entry.at("layout").at("conversions").at(0).at("op"), "concat");
  EXPECT_EQ(entry.at("layout").at("conversions").at(0).at("sources"),
            nlohmann::json::array({"gate_proj.weight", "up_proj.weight"}));
}

TEST(KernelLoader, RefusesMissingFilesAndNonLibraries) {
  expect_refusal<NotFound>([] { load_kernel_library("/nonexistent/libx.so"); },
                           {"/nonexistent/libx.so", "does not exist"});
  const auto junk = std::filesystem::temp_directory_path() / "hk_test_not_a_library.so";
  std::ofstream(junk) << "this is not an ELF file\n";
  expect_refusal<Error>([&] { load_kernel_library(junk); }, {"cannot load", junk.string()});
  std::filesystem::remove(junk);
}

TEST(KernelLoader, TwoVersionsOfOneRepoLiveSideBySide) {
  const auto v1 = versions_lib("heads/v1");
  const auto v2 = versions_lib("heads/v2");
  ASSERT_FALSE(v1.empty());
  ASSERT_FALSE(v2.empty());
  ASSERT_NE(v1, v2);
  auto lib1 = load_kernel_library(v1, "kernels-community/rmsnorm@v1");
  auto lib2 = load_kernel_library(v2, "kernels-community/rmsnorm@v2");
  EXPECT_EQ(lib1->version(), "1.1.0");  // branch v1 carries the highest 1.x release
  EXPECT_EQ(lib2->version(), "2.0.0");
  // Same symbol names, distinct code: RTLD_LOCAL kept each table private to its handle.
  EXPECT_NE(lib1->entries()[0].raw, lib2->entries()[0].raw);
  EXPECT_NE(lib1->entries()[0].raw->forward, lib2->entries()[0].raw->forward);

  KernelFunction f1 = lib1->function("RMSNorm");
  KernelFunction f2 = lib2->function("RMSNorm");
  EXPECT_NE(f1.qualified_name().find("1.1.0"), std::string::npos);
  EXPECT_NE(f2.qualified_name().find("2.0.0"), std::string::npos);

  const auto x = Tensor::from_floats(test::random_values(12, 1), {3, 4});
  const auto w = Tensor::from_floats(test::random_values(4, 2), {4});
  auto y1 = Tensor::zeros({3, 4}, DType::F32), y2 = Tensor::zeros({3, 4}, DType::F32);
  RmsNormAttrs attrs;
  f1.forward({x, w}, {y1}, attrs);
  lib1.reset();  // the function keeps its library alive
  EXPECT_TRUE(still_loaded(v1));
  f2.forward({x, w}, {y2}, attrs);
  EXPECT_EQ(y1.to_doubles(), y2.to_doubles());
  f1.forward({x, w}, {y1}, attrs);

  f1 = KernelFunction();  // last user of v1 gone → dlclose'd
  EXPECT_FALSE(still_loaded(v1));
  EXPECT_TRUE(still_loaded(v2));
}

TEST(KernelLoader, ConcurrentLoadsAndCallsAgree) {
  // dlopen/dlclose of two versions from several threads at once, each thread calling its kernel:
  // every thread sees its own version and the same numbers.
  const auto x = Tensor::from_floats(test::random_values(64, 5), {4, 16});
  const auto w = Tensor::from_floats(test::random_values(16, 6), {16});
  auto expected = Tensor::zeros({4, 16}, DType::F32);
  load_kernel_library(versions_lib("heads/v2"))
      ->function("RMSNorm")
      .forward({x, w}, {expected}, RmsNormAttrs{});
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const bool v1 = (t + i) % 2 == 0;
        auto lib = load_kernel_library(versions_lib(v1 ? "heads/v1" : "heads/v2"));
        auto y = Tensor::zeros({4, 16}, DType::F32);
        lib->function("RMSNorm").forward({x, w}, {y}, RmsNormAttrs{});
        if (lib->version() == (v1 ? "1.1.0" : "2.0.0") && y.to_doubles() == expected.to_doubles())
          ++good;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good.load(), 8 * 20);
  EXPECT_FALSE(still_loaded(versions_lib("heads/v1")));
}

TEST(KernelLoader, TagsResolveToTheirOwnVersions) {
  for (const std::string version : {"1.0.0", "1.1.0", "2.0.0"}) {
    auto lib = load_kernel_library(versions_lib("tags/v" + version));
    EXPECT_EQ(lib->version(), version);
  }
}

TEST(KernelLoader, UntrustedOrgIsNotTheLoadersBusiness) {
  // Trust is checked by the hub before a file gets here; the loader just loads a valid library.
  const auto so =
      library_path(test_hub(), "someone-else/rmsnorm", "heads/v1", "-cpu-", "librmsnorm.so");
  ASSERT_FALSE(so.empty());
  EXPECT_EQ(load_kernel_library(so)->repo(), "someone-else/rmsnorm");
}

TEST(KernelLoader, KernelFailuresBecomeErrorsWithTheKernelsSentence) {
  auto fn = load_kernel_library(versions_lib("heads/v1"))->function("RMSNorm");
  const auto x = Tensor::from_floats(test::random_values(12, 1), {3, 4});
  const auto w_bad = Tensor::from_floats(test::random_values(5, 2), {5});
  auto y = Tensor::zeros({3, 4}, DType::F32);
  expect_refusal<InvalidArgument>(
      [&] {
        fn.forward({x, w_bad}, {y}, RmsNormAttrs{});
      },
      {"kernels-community/rmsnorm:RMSNorm", "forward failed", "weight must be [4]"});
  const auto xi = Tensor::from_ints({1, 2, 3, 4}, {1, 4}, DType::I32);
  auto yi = Tensor::zeros({1, 4}, DType::I32);
  const auto w = Tensor::from_floats(test::random_values(4, 2), {4});
  expect_refusal<Unsupported>(
      [&] {
        fn.forward({xi, w}, {yi}, RmsNormAttrs{});
      },
      {"x must be f32, bf16 or f16"});
  expect_refusal<InvalidArgument>([&] { fn.forward({x}, {y}, RmsNormAttrs{}); },
                                  {"missing input weight"});
}

TEST(KernelLoader, RefusesTensorsOnAnotherDeviceBeforeCalling) {
  auto fn = load_kernel_library(versions_lib("heads/v1"))->function("RMSNorm");
  const auto x = Tensor::from_floats(test::random_values(4, 1), {1, 4});
  TensorView on_gpu = x.view();
  on_gpu.device = Device{DeviceType::CUDA, 0, 90};
  auto y = Tensor::zeros({1, 4}, DType::F32);
  expect_refusal<InvalidArgument>(
      [&] {
        fn.forward({on_gpu, on_gpu}, {y}, RmsNormAttrs{});
      },
      {"runs on cpu", "cuda:0"});
}

TEST(LayerInterfaces, KnowsEveryDeclaredInterfaceAtVersionOne) {
  for (const char* name : {"rms_norm", "layer_norm", "rotary_pos_emb", "mlp", "silu", "linear",
                           "attention", "cross_entropy", "fused_linear_cross_entropy",
                           "causal_lm_loss", "activation", "act_and_mul"}) {
    const InterfaceInfo* info = find_interface(name, 1);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_GT(info->attrs_size, 0u);
    EXPECT_EQ(known_interface_versions(name), std::vector<uint32_t>{1});
  }
  EXPECT_EQ(find_interface("rms_norm", 2), nullptr);
  EXPECT_EQ(find_interface("no_such_layer", 1), nullptr);
  EXPECT_TRUE(known_interface_versions("no_such_layer").empty());
  EXPECT_EQ(find_interface("rms_norm", 1)->attrs_size, sizeof(RmsNormAttrs));
}

}  // namespace
}  // namespace hk
