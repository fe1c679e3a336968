// Variant rules: ABI, CUDA major/minor, arch coverage, backend/device match, entries, preference
// order, and a reason for every rejected variant.
#include <gtest/gtest.h>

#include "hk/hub.h"

namespace hk::hub {
namespace {

VariantMetadata variant(const std::string& name, const std::string& backend,
                        const std::string& version = "", std::vector<std::string> archs = {},
                        int abi = 1) {
  VariantMetadata m;
  m.variant = name;
  m.abi_major = abi;
  m.backend = {backend, version, std::move(archs)};
  m.os = "linux";
  m.arch = host_arch();
  m.entries.push_back({"RMSNorm", "rms_norm", 1, {"inference"}, backend, 0, 0, {"f32"}, false});
  return m;
}

Target cuda_target(int capability, int runtime) {
  Target t;
  t.device.type = DeviceType::CUDA;
  t.device.capability = capability;
  t.cuda_runtime_version = runtime;
  t.arch = host_arch();
  return t;
}

const VariantDecision& find(const std::vector<VariantDecision>& d, const std::string& name) {
  for (const auto& x : d)
    if (x.variant == name) return x;
  throw std::runtime_error("no decision for " + name);
}

TEST(VariantSelection, CudaRules) {
  std::vector<VariantMetadata> vs = {
      variant("hk1-cpu", "cpu"),
      variant("hk1-cu130-90a", "cuda", "13.0", {"90a"}),
      variant("hk1-cu128-80", "cuda", "12.8", {"80"}),
      variant("hk1-cu132-90a", "cuda", "13.2", {"90a"}),
      variant("hk1-cu130-80", "cuda", "13.0", {"80"}),
      variant("hk2-cu130-90a", "cuda", "13.0", {"90a"}, 2),
  };
  auto d = select_variants(vs, cuda_target(90, 13000));
  ASSERT_EQ(d.size(), vs.size());
  EXPECT_EQ(d[0].variant, "hk1-cu130-90a");  // exact arch beats PTX-compatible
  EXPECT_TRUE(d[0].accepted);
  EXPECT_EQ(d[1].variant, "hk1-cu130-80");
  EXPECT_TRUE(d[1].accepted);
  EXPECT_NE(find(d, "hk1-cpu").reason.find("cpu build"), std::string::npos);
  EXPECT_NE(find(d, "hk1-cu128-80").reason.find("majors must match"), std::string::npos);
  EXPECT_NE(find(d, "hk1-cu132-90a").reason.find("newer than the runtime"), std::string::npos);
  EXPECT_NE(find(d, "hk2-cu130-90a").reason.find("ABI 2"), std::string::npos);
  for (const auto& x : d) EXPECT_FALSE(x.reason.empty()) << x.variant;

  // sm_100: 90a does not cover it, plain 80 does (PTX).
  d = select_variants(vs, cuda_target(100, 13020));
  EXPECT_EQ(d[0].variant, "hk1-cu130-80");
  EXPECT_FALSE(find(d, "hk1-cu130-90a").accepted);
  EXPECT_NE(find(d, "hk1-cu130-90a").reason.find("covers"), std::string::npos);
  EXPECT_TRUE(find(d, "hk1-cu132-90a").accepted == false);

  // A newer runtime minor prefers the newest build it can run.
  d = select_variants(
      {variant("a-130", "cuda", "13.0", {"90a"}), variant("b-132", "cuda", "13.2", {"90a"})},
      cuda_target(90, 13020));
  EXPECT_EQ(d[0].variant, "b-132");
  EXPECT_TRUE(d[1].accepted);

  // No CUDA runtime.
  d = select_variants({variant("a", "cuda", "13.0", {"90a"})}, cuda_target(90, 0));
  EXPECT_FALSE(d[0].accepted);
}

TEST(VariantSelection, CpuRocmXpuAndEntries) {
  std::vector<VariantMetadata> vs = {variant("cpu", "cpu"), variant("rocm", "rocm", "6.3"),
                                     variant("xpu", "xpu")};
  Target cpu;
  cpu.arch = host_arch();
  auto d = select_variants(vs, cpu);
  EXPECT_EQ(d[0].variant, "cpu");
  EXPECT_TRUE(d[0].accepted);
  EXPECT_FALSE(d[1].accepted);

  Target rocm = cpu;
  rocm.device.type = DeviceType::ROCM;
  rocm.runtime_version = "6.2";
  d = select_variants(vs, rocm);
  EXPECT_FALSE(find(d, "rocm").accepted);
  EXPECT_NE(find(d, "rocm").reason.find("exactly"), std::string::npos);
  rocm.runtime_version = "6.3";
  EXPECT_TRUE(select_variants(vs, rocm)[0].accepted);

  d = select_variants(vs, cpu, "LigerRMSNorm");
  EXPECT_FALSE(find(d, "cpu").accepted);
  EXPECT_NE(find(d, "cpu").reason.find("no entry LigerRMSNorm"), std::string::npos);

  VariantMetadata other_arch = variant("arm", "cpu");
  other_arch.arch = "riscv64";
  d = select_variants({other_arch}, cpu);
  EXPECT_FALSE(d[0].accepted);
  EXPECT_NE(d[0].reason.find("riscv64"), std::string::npos);
}

}  // namespace
}  // namespace hk::hub
