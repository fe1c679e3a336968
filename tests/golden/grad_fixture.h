// Helpers for the training golden tests: the batch and Transformers' loss / gradients stored in
// tests/fixtures/grads/<model>[.bf16].safetensors (tools/fixtures/make_grad_fixtures.py), one
// training step of an hk model on that batch, and the norm-wise relative error used to compare.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "golden/fixture_util.h"
#include "hk/hub.h"
#include "hk/models.h"
#include "hk/ops.h"
#include "hk/safetensors.h"

namespace hk::testing {

inline const std::vector<std::string>& grad_fixture_names() {
  static const std::vector<std::string> names{"qwen3-tiny", "llama-tiny-bf16"};
  return names;
}

struct GradFixture {
  SafetensorsFile file;
  Tensor input_ids, labels, key_start, position_ids;
  int64_t num_items_in_batch = 0;

  static GradFixture open(const std::string& model, const std::string& suffix = "") {
    GradFixture f{SafetensorsFile::open(source_dir() + "/tests/fixtures/grads/" + model + suffix +
                                        ".safetensors")};
    f.input_ids = f.file.load("input_ids");
    f.labels = f.file.load("labels");
    f.key_start = f.file.load("key_start");
    f.position_ids = f.file.load("position_ids");
    f.num_items_in_batch = f.file.load("num_items_in_batch").to_int64s().at(0);
    return f;
  }
  bool has(const std::string& name) const { return file.find(name) != nullptr; }
  std::vector<double> values(const std::string& name) const {
    return file.load(name, Device::cpu(), DType::F32).to_doubles();
  }
  double loss(const std::string& name = "loss") const { return values(name).at(0); }
  // num_items_in_batch's gradients are the mean's times this (targets / num_items_in_batch).
  double num_items_scale() const {
    return std::stod(file.metadata().at("targets")) / static_cast<double>(num_items_in_batch);
  }
};

// A hub reading only `hub_dir` (a build's embedded or test hub), caching into `cache`.
inline std::shared_ptr<hub::Hub> local_hub(const std::filesystem::path& hub_dir,
                                           const std::filesystem::path& cache) {
  hub::HubConfig hc = hub::HubConfig::from_environment();
  hc.endpoint.clear();
  hc.hub_dir = hub_dir;
  hc.cache_dir = cache;
  hc.offline = false;
  hc.local_kernels.clear();
  return std::make_shared<hub::Hub>(hc);
}
inline std::filesystem::path build_dir() {
  return std::filesystem::path(std::getenv("HK_BINARY_DIR"));
}

// Host f64 copy of any tensor.
inline std::vector<double> host_values(const Tensor& t) {
  Tensor f = t;
  if (t.dtype() != DType::F32 && t.dtype() != DType::F64) {
    f = Tensor::empty(t.sizes(), DType::F32, t.device());
    ops::cast(t, f);
  }
  return (f.device().is_cpu() ? f : f.to(Device::cpu())).to_doubles();
}

// ||got - want|| / ||want|| (the norm-wise relative error of a tensor).
inline double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// One training forward + backward of `model` (already in train mode) on the fixture batch.
inline Loss train_step(const CausalLM& model, const GradFixture& f, bool num_items = false,
                       bool pass_positions = false) {
  ForwardOptions o;
  o.labels = f.labels;
  o.key_start = f.key_start;
  if (pass_positions) o.position_ids = f.position_ids;
  if (num_items) o.num_items_in_batch = f.num_items_in_batch;
  CausalLMOutput out = model.forward(f.input_ids, o);
  out.loss.backward();
  return out.loss;
}

// Every parameter's gradient against the fixture's grad.<name> (every one must be there, and the
// fixture must have no gradient the model lacks). `scale` multiplies the reference.
inline void expect_all_grads(const CausalLM& model, const GradFixture& f, double tolerance,
                             const std::string& what, double scale = 1.0) {
  size_t compared = 0;
  for (auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(f.has("grad." + name)) << what << ": the fixture has no gradient for " << name;
    ASSERT_TRUE(p->grad.defined()) << what << ": " << name << " got no gradient";
    EXPECT_EQ(p->grad.sizes(), p->value.sizes()) << name;
    EXPECT_EQ(p->grad.dtype(), p->value.dtype()) << name;
    std::vector<double> want = f.values("grad." + name);
    for (double& w : want) w *= scale;
    const double err = relative_error(host_values(p->grad), want);
    EXPECT_LE(err, tolerance) << what << ": gradient of " << name;
    ++compared;
  }
  size_t in_fixture = 0;
  for (const auto& info : f.file.tensors()) in_fixture += info.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, in_fixture) << what << ": hk lists " << compared
                                  << " parameters, Transformers " << in_fixture;
}

}  // namespace hk::testing
