// TrainingArguments defaults (Transformers 5.17's) and validation; the Liger switches: parsing,
// Liger's defaults, the exclusive loss pair, unknown keys, and the KernelConfig they become.
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/training_args.h"

namespace hk {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(TrainingArguments, DefaultsAreTransformers) {
  TrainingArguments a;
  EXPECT_EQ(a.per_device_train_batch_size, 8);
  EXPECT_EQ(a.gradient_accumulation_steps, 1);
  EXPECT_DOUBLE_EQ(a.learning_rate, 5e-5);
  EXPECT_DOUBLE_EQ(a.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(a.adam_beta1, 0.9);
  EXPECT_DOUBLE_EQ(a.adam_beta2, 0.999);
  EXPECT_DOUBLE_EQ(a.adam_epsilon, 1e-8);
  EXPECT_DOUBLE_EQ(a.max_grad_norm, 1.0);
  EXPECT_DOUBLE_EQ(a.num_train_epochs, 3.0);
  EXPECT_EQ(a.max_steps, -1);
  EXPECT_EQ(a.lr_scheduler_type, "linear");
  EXPECT_DOUBLE_EQ(a.logging_steps, 500);
  EXPECT_DOUBLE_EQ(a.save_steps, 500);
  EXPECT_EQ(a.seed, 42u);
  EXPECT_FALSE(a.bf16);
  EXPECT_FALSE(a.use_liger_kernel);
}

TEST(TrainingArguments, ValidationNamesTheFlag) {
  auto bad = [](auto&& mutate) {
    TrainingArguments a;
    a.output_dir = "out";
    mutate(a);
    return message_of([&] { a.validate(); });
  };
  EXPECT_NE(bad([](auto& a) { a.output_dir.clear(); }).find("--output-dir"), std::string::npos);
  EXPECT_NE(
      bad([](auto& a) { a.per_device_train_batch_size = 0; }).find("--per-device-train-batch-size"),
      std::string::npos);
  EXPECT_NE(
      bad([](auto& a) { a.gradient_accumulation_steps = 0; }).find("--gradient-accumulation-steps"),
      std::string::npos);
  EXPECT_NE(bad([](auto& a) { a.adam_beta2 = 1.0; }).find("--adam-beta2"), std::string::npos);
  EXPECT_NE(bad([](auto& a) { a.max_grad_norm = -1; }).find("--max-grad-norm"), std::string::npos);
  EXPECT_NE(bad([](auto& a) { a.lr_scheduler_type = "polynomial"; }).find("polynomial"),
            std::string::npos);
  EXPECT_NE(bad([](auto& a) { a.logging_steps = 2.5; }).find("--logging-steps"), std::string::npos);
  EXPECT_NE(bad([](auto& a) { a.save_total_limit = 0; }).find("--save-total-limit"),
            std::string::npos);
  EXPECT_NE(bad([](auto& a) { a.max_steps = 0; }).find("--max-steps"), std::string::npos);
  EXPECT_EQ(bad([](auto&) {}), "");
  EXPECT_EQ(TrainingArguments::steps_from(0.25, 10), 3);
  EXPECT_EQ(TrainingArguments::steps_from(7, 10), 7);
}

TEST(LigerKernelConfig, DefaultsAreApplyLigerKernelToQwen3) {
  LigerKernelConfig c = LigerKernelConfig::resolve({});
  EXPECT_TRUE(c.rope);
  EXPECT_TRUE(c.rms_norm);
  EXPECT_TRUE(c.swiglu);
  EXPECT_TRUE(c.fused_linear_cross_entropy);
  EXPECT_FALSE(c.cross_entropy);
  EXPECT_FALSE(c.geglu);
  EXPECT_FALSE(c.layer_norm);
  EXPECT_EQ(c.str(),
            "rope=true,swiglu=true,geglu=false,cross_entropy=false,"
            "fused_linear_cross_entropy=true,rms_norm=true,layer_norm=false");
}

TEST(LigerKernelConfig, ParseAndErrors) {
  auto m = LigerKernelConfig::parse("rope=true, swiglu=False,rms_norm=0");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_TRUE(m["rope"]);
  EXPECT_FALSE(m["swiglu"]);
  EXPECT_FALSE(m["rms_norm"]);
  const std::string unknown =
      message_of([] { LigerKernelConfig::parse("rope=true,fused_rope=true"); });
  EXPECT_NE(unknown.find("fused_rope"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("fused_linear_cross_entropy"), std::string::npos)
      << unknown;  // the known keys
  const std::string both = message_of([] { LigerKernelConfig::parse("cross_entropy=true"); });
  EXPECT_NE(both.find("cannot both be true"), std::string::npos) << both;
  EXPECT_EQ(message_of([] {
              LigerKernelConfig::parse("cross_entropy=true,fused_linear_cross_entropy=false");
            }),
            "");
  EXPECT_NE(message_of([] { LigerKernelConfig::parse("rope"); }).find("key=value"),
            std::string::npos);
  EXPECT_NE(message_of([] { LigerKernelConfig::parse("rope=maybe"); }).find("true or false"),
            std::string::npos);
}

TEST(LigerKernelConfig, BecomesLigerKernelsEntriesForTheModelsLayers) {
  const std::vector<std::string> qwen3 = {
      "Embedding", "RMSNorm", "attention", "rotary_pos_emb", "MLP", "Linear", "ForCausalLMLoss"};
  std::vector<std::string> skipped;
  KernelConfig k =
      LigerKernelConfig::resolve({{"layer_norm", true}}).kernel_config(qwen3, "silu", &skipped);
  EXPECT_FALSE(k.inherit_mapping);
  auto spec = [&](const std::string& layer) {
    auto it = k.kernel_mapping.find(layer);
    return it == k.kernel_mapping.end() ? std::string("<none>")
                                        : it->second.for_device("cpu")->spec;
  };
  EXPECT_EQ(spec("RMSNorm"), "kernels-community/liger-kernels:LigerRMSNorm");
  EXPECT_EQ(spec("rotary_pos_emb"), "kernels-community/liger-kernels:LigerRope");
  EXPECT_EQ(spec("MLP"), "kernels-community/liger-kernels:LigerSwiGLUMLP");
  EXPECT_EQ(spec("ForCausalLMLoss"),
            "kernels-community/liger-kernels:LigerFusedLinearCrossEntropyLoss");
  EXPECT_EQ(spec("LayerNorm"), "<none>");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("layer_norm"), std::string::npos);
  EXPECT_EQ(k.kernel_mapping.at("RMSNorm").for_device("cuda")->options.version, 3);

  KernelConfig ce =
      LigerKernelConfig::resolve(
          {{"cross_entropy", true}, {"fused_linear_cross_entropy", false}, {"rope", false}})
          .kernel_config(qwen3);
  EXPECT_EQ(ce.kernel_mapping.at("ForCausalLMLoss").for_device("cpu")->spec,
            "kernels-community/liger-kernels:LigerForCausalLMLoss");
  EXPECT_EQ(ce.kernel_mapping.count("rotary_pos_emb"), 0u);

  skipped.clear();
  KernelConfig gelu = LigerKernelConfig::resolve({{"geglu", true}})
                          .kernel_config(qwen3, "gelu_pytorch_tanh", &skipped);
  EXPECT_EQ(gelu.kernel_mapping.at("MLP").for_device("cpu")->spec,
            "kernels-community/liger-kernels:LigerGEGLUMLP");
  EXPECT_EQ(skipped.size(), 1u);  // swiglu does not apply to a GELU MLP
}

}  // namespace
}  // namespace hk
