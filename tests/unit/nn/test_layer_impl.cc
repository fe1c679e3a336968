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
// nn::forward_linears runs built-in sibling Linears whose weights (and biases) are adjacent rows of
// one buffer, writing adjacent columns of one output, as one product — with the results of
// separate calls; anything else runs one Linear at a time.
Tensor counting(const Shape& shape, float scale) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>((i * 7919) % 17) - 1.0f;
  return Tensor::from_floats(v, shape);
}

TEST(LinearSiblings, AdjacentWeightsAndOutputsGiveTheResultsOfSeparateCalls) {
  const int64_t k = 8;
  const std::vector<int64_t> outs = {4, 2, 3};
  std::vector<std::shared_ptr<nn::Linear>> lins;
  const Tensor w = counting({9, k}, 0.125f), b = counting({9}, 0.25f);
  int64_t row = 0;
  for (int64_t n : outs) {
    lins.push_back(std::make_shared<nn::Linear>(k, n, /*bias=*/true));
    lins.back()->slot("weight").value = w.slice(0, row, row + n);
    lins.back()->slot("bias").value = b.slice(0, row, row + n);
    row += n;
  }
  const Tensor x = counting({2, 3, k}, 0.0625f);
  std::vector<std::vector<double>> want;
  for (size_t i = 0; i < lins.size(); ++i) {
    Tensor y = Tensor::zeros({2, 3, outs[i]}, DType::F32);
    lins[i]->forward(x, y);
    want.push_back(y.to_doubles());
  }
  auto check = [&](const std::vector<Tensor>& ys, const std::string& what) {
    std::vector<nn::LinearCall> calls;
    for (size_t i = 0; i < lins.size(); ++i) calls.push_back({lins[i].get(), ys[i], "p"});
    nn::forward_linears(x, calls);
    for (size_t i = 0; i < lins.size(); ++i) {
      const std::vector<double> got = ys[i].contiguous().to_doubles();
      ASSERT_EQ(got.size(), want[i].size()) << what;
      for (size_t e = 0; e < got.size(); ++e)
        EXPECT_NEAR(got[e], want[i][e], 1e-6) << what << " linear " << i << " element " << e;
    }
  };
  // adjacent columns of one output: one product
  const Tensor all = Tensor::zeros({2, 3, 9}, DType::F32);
  check({all.slice(2, 0, 4), all.slice(2, 4, 6), all.slice(2, 6, 9)}, "adjacent");
  // separate outputs: one at a time
  check({Tensor::zeros({2, 3, 4}, DType::F32), Tensor::zeros({2, 3, 2}, DType::F32),
         Tensor::zeros({2, 3, 3}, DType::F32)},
        "separate outputs");
  // the outputs' columns out of order: the run stops where adjacency does
  const Tensor swapped = Tensor::zeros({2, 3, 9}, DType::F32);
  check({swapped.slice(2, 0, 4), swapped.slice(2, 7, 9), swapped.slice(2, 4, 7)}, "out of order");
  // weights in separate buffers: one at a time
  lins[1]->slot("weight").value = w.slice(0, 4, 6).contiguous();
  const Tensor again = Tensor::zeros({2, 3, 9}, DType::F32);
  check({again.slice(2, 0, 4), again.slice(2, 4, 6), again.slice(2, 6, 9)}, "separate weights");
}

}  // namespace hk
