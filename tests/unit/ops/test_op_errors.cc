// Argument checks of the op dispatchers: wrong shapes, dtypes and mixed devices throw
// hk::InvalidArgument naming the op (and showing the operands); an unsupported device type throws
// hk::Unsupported. Tensors on a pretend device are never dereferenced: checks come first.
#include <gtest/gtest.h>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

TensorView on(DeviceType type, const Tensor& t) {
  TensorView v = t.view();
  v.device = Device{type, 0, 0};
  return v;
}

Tensor f32(const Shape& s) {
  return Tensor::zeros(s, DType::F32);
}
Tensor bf16(const Shape& s) {
  return Tensor::zeros(s, DType::BF16);
}

TEST(OpErrors, ShapesDtypesAndDevicesNameTheOp) {
  // matmul / linear
  HK_EXPECT_INVALID(ops::matmul(f32({2, 3}), f32({4, 5}), f32({2, 5})), "matmul");
  HK_EXPECT_INVALID(ops::matmul(f32({2, 3}), bf16({3, 5}), f32({2, 5})), "matmul");
  HK_EXPECT_INVALID(ops::matmul(f32({2, 3}), f32({3, 5}), f32({2, 4})), "matmul");
  HK_EXPECT_INVALID(ops::matmul(f32({2, 2, 3}), f32({3, 3, 5}), f32({2, 2, 5})), "matmul");
  HK_EXPECT_INVALID(ops::matmul(f32({2, 3}), on(DeviceType::CUDA, f32({3, 5})), f32({2, 5})),
                    "matmul");
  HK_EXPECT_INVALID(ops::linear(f32({2, 3}), f32({4, 2}), nullptr, f32({2, 4})), "linear");
  Tensor bad_bias = f32({5});
  HK_EXPECT_INVALID(ops::linear(f32({2, 3}), f32({4, 3}), &bad_bias.view(), f32({2, 4})), "linear");
  Tensor dx = f32({2, 4});
  HK_EXPECT_INVALID(ops::linear_backward(f32({2, 4}), f32({2, 3}), f32({4, 3}), &dx.view(), nullptr,
                                         nullptr, false),
                    "linear_backward");
  // embedding
  HK_EXPECT_INVALID(ops::embedding(f32({5, 3}), f32({2}), f32({2, 3})), "embedding");
  HK_EXPECT_INVALID(ops::embedding(f32({5, 3}), Tensor::from_ints({1}, {1}), f32({1, 4})),
                    "embedding");
  HK_EXPECT_INVALID(ops::embedding_backward(bf16({1, 3}), Tensor::from_ints({1}, {1}),
                                            Tensor::zeros({5, 3}, DType::F16)),
                    "embedding_backward");
  // norms
  HK_EXPECT_INVALID(ops::rms_norm(f32({2, 3}), f32({4}), 1e-6f, f32({2, 3})), "rms_norm");
  HK_EXPECT_INVALID(ops::rms_norm(f32({2, 3}), f32({3}), 1e-6f, f32({3, 2})), "rms_norm");
  Tensor rstd = f32({3});
  HK_EXPECT_INVALID(ops::rms_norm(f32({2, 3}), f32({3}), 1e-6f, f32({2, 3}), &rstd.view()),
                    "rms_norm");
  HK_EXPECT_INVALID(ops::rms_norm_backward(f32({2, 3}), f32({2, 3}), f32({3}), 1e-6f, nullptr,
                                           f32({2, 4}), nullptr),
                    "rms_norm_backward");
  HK_EXPECT_INVALID(ops::layer_norm(f32({2, 3}), f32({2}), nullptr, 1e-5f, f32({2, 3})),
                    "layer_norm");
  // rotary
  HK_EXPECT_INVALID(ops::rotary_tables(Tensor::from_ints({0, 1}, {1, 2}), 3, 1e4, 1, f32({1, 2, 3}),
                                       f32({1, 2, 3})),
                    "rotary_tables");
  HK_EXPECT_INVALID(
      ops::rotary_embedding(f32({1, 2, 1, 4}), f32({1, 2, 6}), f32({1, 2, 6}), f32({1, 2, 1, 4})),
      "rotary_embedding");
  HK_EXPECT_INVALID(ops::rotary_embedding(bf16({1, 2, 1, 4}), bf16({1, 2, 4}), bf16({1, 2, 4}),
                                          bf16({1, 2, 1, 4})),
                    "rotary_embedding");
  HK_EXPECT_INVALID(ops::rotary_embedding_backward(f32({1, 2, 1, 4}), f32({1, 2, 4}),
                                                   f32({1, 2, 4}), bf16({1, 2, 1, 4})),
                    "rotary_embedding_backward");
  // elementwise
  HK_EXPECT_INVALID(ops::activation(ops::Activation::SiLU, f32({3}), bf16({3})), "activation");
  HK_EXPECT_INVALID(ops::activation_backward(ops::Activation::GELU, f32({3}), f32({4}), f32({3})),
                    "activation_backward");
  HK_EXPECT_INVALID(ops::act_mul(ops::Activation::SiLU, f32({3}), f32({4}), f32({3})), "act_mul");
  HK_EXPECT_INVALID(ops::act_mul_backward(ops::Activation::SiLU, f32({3}), f32({3}), f32({3}),
                                          f32({3}), bf16({3})),
                    "act_mul_backward");
  HK_EXPECT_INVALID(ops::add(f32({2, 3}), f32({2}), f32({2, 3})), "add");
  HK_EXPECT_INVALID(ops::add(f32({2, 3}), f32({3, 3}), f32({2, 3})), "add");
  HK_EXPECT_INVALID(ops::mul(f32({2, 3}), f32({3}), f32({3, 2})), "mul");
  HK_EXPECT_INVALID(ops::scale(f32({2}), 2.0f, bf16({2})), "scale");
  HK_EXPECT_INVALID(ops::cast(f32({2}), bf16({3})), "cast");
  HK_EXPECT_INVALID(ops::cast(f32({2}), on(DeviceType::CUDA, bf16({2}))), "cast");
  // softmax / attention
  HK_EXPECT_INVALID(ops::softmax(f32({2, 3}), f32({2, 4})), "softmax");
  HK_EXPECT_INVALID(ops::softmax_backward(f32({2, 3}), f32({2, 3}), bf16({2, 3})),
                    "softmax_backward");
  HK_EXPECT_INVALID(
      ops::attention(f32({1, 2, 3, 4}), f32({1, 2, 2, 4}), f32({1, 2, 2, 4}), f32({1, 2, 3, 4})),
      "attention");  // 3 q heads, 2 kv heads
  HK_EXPECT_INVALID(
      ops::attention(f32({1, 2, 2, 4}), f32({1, 2, 1, 8}), f32({1, 2, 1, 8}), f32({1, 2, 2, 4})),
      "attention");
  Tensor probs = f32({1, 2, 2, 3});
  HK_EXPECT_INVALID(ops::attention(f32({1, 2, 2, 4}), f32({1, 2, 1, 4}), f32({1, 2, 1, 4}),
                                   f32({1, 2, 2, 4}), {}, &probs.view()),
                    "attention");
  Tensor ks = Tensor::from_ints({0, 0}, {2}, DType::I32);
  ops::AttentionOptions o;
  o.key_start = &ks.view();
  HK_EXPECT_INVALID(
      ops::attention(f32({1, 2, 2, 4}), f32({1, 2, 1, 4}), f32({1, 2, 1, 4}), f32({1, 2, 2, 4}), o),
      "attention");
  Tensor good_probs = f32({1, 2, 2, 2});
  HK_EXPECT_INVALID(ops::attention_backward(f32({1, 2, 2, 4}), f32({1, 2, 2, 4}), f32({1, 2, 1, 4}),
                                            f32({1, 2, 1, 4}), good_probs, f32({1, 2, 2, 4}),
                                            f32({1, 2, 2, 4}), f32({1, 2, 1, 4})),
                    "attention_backward");  // dk shaped like q
  // cross entropy / argmax
  HK_EXPECT_INVALID(ops::cross_entropy(f32({2, 3}), Tensor::from_ints({0, 1, 2}, {3}), f32({})),
                    "cross_entropy");
  HK_EXPECT_INVALID(ops::cross_entropy(f32({2, 3}), Tensor::from_ints({0, 1}, {2}), f32({2})),
                    "cross_entropy");  // Mean needs a scalar
  HK_EXPECT_INVALID(ops::cross_entropy(f32({2, 3}), Tensor::from_ints({0, 1}, {2}), bf16({})),
                    "cross_entropy");
  HK_EXPECT_INVALID(ops::cross_entropy_backward(f32({}), f32({2, 3}),
                                                Tensor::from_ints({0, 1}, {2}), bf16({2, 3})),
                    "cross_entropy_backward");
  HK_EXPECT_INVALID(ops::argmax(f32({2, 3}), Tensor::zeros({2}, DType::I32)), "argmax");
  HK_EXPECT_INVALID(ops::argmax(f32({2, 3}), Tensor::zeros({3}, DType::I64)), "argmax");
}

TEST(OpErrors, MessageShowsOperands) {
  try {
    ops::softmax(f32({2, 3}), f32({2, 4}));
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("softmax"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[2, 4]"), std::string::npos) << m;
  }
}

TEST(OpErrors, DeviceWithoutImplementationIsUnsupported) {
  EXPECT_THROW(ops::softmax(on(DeviceType::XPU, f32({2, 3})), on(DeviceType::XPU, f32({2, 3}))),
               Unsupported);
  EXPECT_THROW(ops::fill(on(DeviceType::MPS, f32({2})), 1.0), Unsupported);
}

}  // namespace
}  // namespace hk
