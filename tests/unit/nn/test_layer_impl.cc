// The kernelize hook: swapping a layer's implementation at run time changes what runs without
// touching model code; reset_impl restores the built-in; a wrong interface is rejected; attention
// functions are looked up by name.
#include <gtest/gtest.h>

#include <atomic>

#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/layers.h"
#include "hk/models.h"

namespace hk {
namespace {

std::string fixture() {
  return std::string(HK_TEST_SOURCE_DIR) + "/tests/fixtures/models/qwen3-tiny";
}

// An RMSNorm "kernel" that counts calls and can perturb its output.
class CountingRMSNorm : public nn::RMSNormImpl {
 public:
  explicit CountingRMSNorm(float extra_scale) : scale_(extra_scale) {}
  std::string name() const override { return "test/counting:RMSNorm"; }
  void forward(const nn::RMSNorm& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    ++calls;
    ops::rms_norm(x, layer.weight(), static_cast<float>(layer.eps()), y, nullptr, stream);
    if (scale_ != 1.0f) ops::scale(y, scale_, y, stream);
  }
  mutable std::atomic<int> calls{0};

 private:
  float scale_;
};

std::vector<double> last_logits(const CausalLM& lm) {
  Tensor ids = Tensor::from_ints({5, 17, 42, 7}, {1, 4});
  return lm.forward(ids, ForwardOptions{.logits_to_keep = 1}).logits.to_doubles();
}

TEST(LayerImpl, SwappingRMSNormChangesWhatRuns) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  const std::vector<double> reference = last_logits(lm);

  auto same = std::make_shared<CountingRMSNorm>(1.0f);
  int norms = 0;
  for (auto& [path, m] : lm.module().named_modules())
    if (m->layer_interface() == "RMSNorm") {
      m->set_impl(same);
      ++norms;
    }
  EXPECT_EQ(norms, 2 * 4 + 1);  // per layer: input, post-attention, q_norm, k_norm; final norm
  EXPECT_EQ(lm.module().find_module("model.norm")->impl()->name(), "test/counting:RMSNorm");
  EXPECT_EQ(last_logits(lm), reference);
  EXPECT_EQ(same->calls.load(), norms);

  auto perturbed = std::make_shared<CountingRMSNorm>(1.5f);
  lm.module().find_module("model.norm")->set_impl(perturbed);
  EXPECT_NE(last_logits(lm), reference);
  EXPECT_EQ(perturbed->calls.load(), 1);

  for (auto& [path, m] : lm.module().named_modules()) m->reset_impl();
  EXPECT_EQ(lm.module().find_module("model.norm")->impl()->name(), "builtin");
  EXPECT_EQ(last_logits(lm), reference);
}

TEST(LayerImpl, BeforeLoadHookSeesTheUnallocatedTree) {
  auto counting = std::make_shared<CountingRMSNorm>(1.0f);
  bool called = false;
  LoadOptions options;
  options.before_load = [&](nn::Module& root) {
    called = true;
    EXPECT_FALSE(root.find_module("model.norm")->slot("weight").value.defined());
    root.find_module("model.norm")->set_impl(counting);
  };
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture(), options);
  EXPECT_TRUE(called);
  last_logits(lm);
  EXPECT_EQ(counting->calls.load(), 1);
}

TEST(LayerImpl, WrongInterfaceIsRejected) {
  CausalLM lm = AutoModelForCausalLM::from_config(ModelConfig::from_file(fixture()));
  auto norm_impl = std::make_shared<CountingRMSNorm>(1.0f);
  try {
    lm.module().find_module("model.layers.0.mlp")->set_impl(norm_impl);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'MLP'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lm.module().find_module("model.layers")->set_impl(norm_impl), InvalidArgument);
}

TEST(LayerImpl, AttentionFunctionsByName) {
  std::atomic<int> calls{0};
  nn::register_attention_function(
      "test_counting", [&calls](const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const nn::AttentionCall& call, Stream s) {
        ++calls;
        nn::attention_function("eager")(q, k, v, out, call, s);
      });
  CausalLM eager = AutoModelForCausalLM::from_pretrained(fixture());
  CausalLM counted =
      AutoModelForCausalLM::from_pretrained(fixture(), {.attn_implementation = "test_counting"});
  EXPECT_EQ(last_logits(counted), last_logits(eager));
  EXPECT_EQ(calls.load(), 2);  // one per layer
  // Unknown names are not built in, so they go to kernelize, which rejects them with the name.
  try {
    AutoModelForCausalLM::from_pretrained(fixture(), {.attn_implementation = "flash_attention_9"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flash_attention_9"), std::string::npos) << e.what();
  }
  auto* attn =
      dynamic_cast<nn::Attention*>(counted.module().find_module("model.layers.0.self_attn"));
  ASSERT_NE(attn, nullptr);
  EXPECT_THROW(attn->set_attn_implementation("nope"), InvalidArgument);
}

}  // namespace
}  // namespace hk
