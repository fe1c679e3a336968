// KernelConfig in C++ and JSON: every value form, strict errors naming the key.
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/kernel_config.h"

namespace hk {

TEST(KernelConfig, CppValueForms) {
  KernelConfig c{
      {{"RMSNorm", "kernels-community/liger-kernels:LigerRMSNorm"},
       {"rotary_pos_emb",
        {"kernels-community/rotary:apply_rotary_transformers", KernelOptions{.version = 2}}},
       {"MLP", KernelMappingValue::devices({{"cuda", {"a/b:C", {}}}, {"xpu", {"d/e:F", {}}}})},
       {"SiLU", ""}}};
  EXPECT_EQ(c.kernel_mapping.at("RMSNorm").for_device("cuda")->spec,
            "kernels-community/liger-kernels:LigerRMSNorm");
  EXPECT_EQ(*c.kernel_mapping.at("rotary_pos_emb").for_device("cpu")->options.version, 2);
  EXPECT_EQ(c.kernel_mapping.at("MLP").for_device("xpu")->spec, "d/e:F");
  EXPECT_FALSE(c.kernel_mapping.at("MLP").for_device("cpu").has_value());
  EXPECT_TRUE(c.kernel_mapping.at("SiLU").for_device("cpu")->disabled());
  EXPECT_TRUE(c.inherit_mapping);
}

TEST(KernelConfig, JsonValueForms) {
  auto c = KernelConfig::from_json(R"({
    "kernel_mapping": {
      "RMSNorm": "org/repo:Entry",
      "rotary_pos_emb": ["org/rot:fn", {"version": 2}],
      "MLP": {"cuda": "a/b:C", "cpu": ["a/b:C", {"revision": "v1.2.0", "trust_remote_code": true}]},
      "SiLU": ""
    },
    "fusions": [{"modules": [["RMSNorm", "model.layers.*.post_attention_layernorm"],
                             ["MLP", "model.layers.*.mlp"]], "kernel": "org/repo:RMSNormMLP"}],
    "inherit_mapping": false, "use_local_kernel": false})");
  EXPECT_FALSE(c.inherit_mapping);
  EXPECT_EQ(*c.kernel_mapping.at("rotary_pos_emb").for_device("cuda")->options.version, 2);
  auto cpu_mlp = *c.kernel_mapping.at("MLP").for_device("cpu");
  EXPECT_EQ(*cpu_mlp.options.revision, "v1.2.0");
  EXPECT_TRUE(cpu_mlp.options.trust_remote_code);
  EXPECT_TRUE(c.kernel_mapping.at("SiLU").for_device("cuda")->disabled());
  ASSERT_EQ(c.fusions.size(), 1u);
  EXPECT_EQ(c.fusions[0].modules[1].second, "model.layers.*.mlp");
  EXPECT_EQ(c.fusions[0].kernel.spec, "org/repo:RMSNormMLP");
}

TEST(KernelConfig, JsonErrorsNameTheKey) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      KernelConfig::from_json(text, "cfg.json");
      ADD_FAILURE() << "no error for " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{", "not valid JSON");
  expect_error(R"({"kernel_maping": {}})", "kernel_maping");
  expect_error(R"({"kernel_mapping": {"RMSNorm": 3}})", "kernel_mapping.RMSNorm");
  expect_error(R"({"kernel_mapping": {"RMSNorm": ["a/b", {"versoin": 2}]}})", "versoin");
  expect_error(R"({"kernel_mapping": {"RMSNorm": ["a/b", {"version": 2, "revision": "x"}]}})",
               "not both");
  expect_error(R"({"kernel_mapping": {"RMSNorm": {"gpu": "a/b"}}})", "kernel_mapping.RMSNorm.gpu");
  expect_error(R"({"fusions": [{"modules": [["RMSNorm", "a.*.b"]], "kernel": "a/b:C"}]})",
               "at least two");
  expect_error(R"({"inherit_mapping": "no"})", "inherit_mapping");
  EXPECT_THROW(KernelConfig::from_file("/nonexistent/cfg.json"), NotFound);
  // A key given twice is refused (the parser used to keep the last one silently).
  expect_error(R"({"kernel_mapping": {"RMSNorm": "a/b:X", "RMSNorm": "evil/repo:Y"}})",
               "has the key \"RMSNorm\" twice in \"kernel_mapping\"");
  expect_error(R"({"kernel_mapping": {}, "kernel_mapping": {"RMSNorm": "evil/repo"}})",
               "twice in the top-level object");
  expect_error(R"({"kernel_mapping": {"MLP": {"cuda": "a/b", "cuda": "c/d"}}})",
               "twice in \"kernel_mapping.MLP\"");
  expect_error(std::string(50000, '[') + std::string(50000, ']'), "nests deeper than 64");
}

}  // namespace hk
