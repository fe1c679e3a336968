// activation_interfaces.h — PROPOSED layer interfaces for the rest of kernels-community/activation
// (not registered in hk/layer_interfaces.h yet; nothing includes this file until they are).
//
//   activation@1  forward  inputs: x            outputs: y (x's shape; may alias x)
//                 backward inputs: dy, x        outputs: dx
//                 y = act(x) with act from ActivationAttrs::kind
//   act_and_mul@1 forward  inputs: x [..., 2d]  outputs: y [..., d]
//                 backward inputs: dy, x        outputs: dx [..., 2d]
//                 y = round(act(x[..., :d])) · x[..., d:]   (silu_and_mul, gelu_and_mul,
//                 gelu_tanh_and_mul; Liger's SwiGLU/GeGLU activation with gate and up given as one
//                 tensor or — with the optional second input — as two)
// The kernels exist (liger_core_*: unary_act_fwd/bwd, gated_act_fwd/bwd).
#pragma once

#include <cstdint>

namespace hk_activation {

inline constexpr uint32_t kSiLU = 0;
inline constexpr uint32_t kGELU = 1;       // erf form
inline constexpr uint32_t kGELUTanh = 2;   // also FastGELU, NewGELU
inline constexpr uint32_t kQuickGELU = 3;  // x·σ(1.702x)

struct ActivationAttrs {
  uint32_t kind = kSiLU;
};

}  // namespace hk_activation
