// abi/glue.h — the C ABI side of the liger kernels: each function reads an hk_call laid out as its
// layer interface says (hk/layer_interfaces.h), validates it, fills the argument structs of
// liger/args.h and runs the cpu or cuda implementation. One source (abi/glue.cc) is compiled twice,
// into namespace liger_abi::cpu (liger_core_cpu) and liger_abi::cuda (liger_core_cuda); the entry
// tables of the three repos built from this code (liger-kernels, rotary, activation) pick from
// these.
//
// Liger's own behaviour that the interfaces name (hk/layer_interfaces.h): rms_norm@1 casting_mode
// 2 = none (computed as gemma: f32 math, one rounding); cross_entropy@1's optional forward output
// dlogits (index 3; may alias logits) and fused_linear_cross_entropy@1's optional forward outputs
// dx, dweight (indices 1, 2) — the gradients for dloss = 1 written by the forward, so training
// needs no backward call; mlp@1's optional forward outputs gate, up (indices 1, 2) and backward
// inputs gate, up (indices 5, 6): the kept pre-activations, which backward overwrites with their
// gradients. FLCE's bias and dbias are refused with HK_STATUS_UNSUPPORTED.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hk_abi/hk_kernel.h"

#define LIGER_ABI_DECLARE(ns)                                                                \
  namespace liger_abi::ns {                                                                  \
  hk_status rms_norm_forward(const hk_call* call) noexcept;                                  \
  hk_status rms_norm_backward(const hk_call* call) noexcept;                                 \
  hk_status rms_norm_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept;      \
  hk_status layer_norm_forward(const hk_call* call) noexcept;                                \
  hk_status layer_norm_backward(const hk_call* call) noexcept;                               \
  hk_status layer_norm_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept;    \
  hk_status rotary_forward(const hk_call* call) noexcept;                                    \
  hk_status rotary_backward(const hk_call* call) noexcept;                                   \
  hk_status silu_forward(const hk_call* call) noexcept;                                      \
  hk_status silu_backward(const hk_call* call) noexcept;                                     \
  hk_status mlp_forward(const hk_call* call) noexcept;                                       \
  hk_status mlp_backward(const hk_call* call) noexcept;                                      \
  hk_status mlp_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept;           \
  hk_status linear_forward(const hk_call* call) noexcept;                                    \
  hk_status linear_backward(const hk_call* call) noexcept;                                   \
  hk_status linear_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept;        \
  hk_status cross_entropy_forward(const hk_call* call) noexcept;                             \
  hk_status cross_entropy_backward(const hk_call* call) noexcept;                            \
  hk_status cross_entropy_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept; \
  hk_status flce_forward(const hk_call* call) noexcept;                                      \
  hk_status flce_backward(const hk_call* call) noexcept;                                     \
  hk_status flce_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept;          \
  hk_status causal_lm_forward(const hk_call* call) noexcept;                                 \
  hk_status causal_lm_backward(const hk_call* call) noexcept;                                \
  hk_status causal_lm_workspace(const hk_call* call, uint32_t pass, size_t* b) noexcept;     \
  /* kernels-community/activation: activation@1 and act_and_mul@1 with a fixed function */   \
  hk_status silu_act_forward(const hk_call* call) noexcept;                                  \
  hk_status silu_act_backward(const hk_call* call) noexcept;                                 \
  hk_status gelu_forward(const hk_call* call) noexcept;                                      \
  hk_status gelu_backward(const hk_call* call) noexcept;                                     \
  hk_status gelu_tanh_forward(const hk_call* call) noexcept;                                 \
  hk_status gelu_tanh_backward(const hk_call* call) noexcept;                                \
  hk_status quick_gelu_forward(const hk_call* call) noexcept;                                \
  hk_status quick_gelu_backward(const hk_call* call) noexcept;                               \
  hk_status silu_and_mul_forward(const hk_call* call) noexcept;                              \
  hk_status silu_and_mul_backward(const hk_call* call) noexcept;                             \
  hk_status gelu_and_mul_forward(const hk_call* call) noexcept;                              \
  hk_status gelu_and_mul_backward(const hk_call* call) noexcept;                             \
  hk_status gelu_tanh_and_mul_forward(const hk_call* call) noexcept;                         \
  hk_status gelu_tanh_and_mul_backward(const hk_call* call) noexcept;                        \
  }

LIGER_ABI_DECLARE(cpu)
LIGER_ABI_DECLARE(cuda)
