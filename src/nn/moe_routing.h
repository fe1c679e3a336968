// Internal (src/nn): the MoE routing on the host — softmax, top-k, renormalisation and the
// grouping of (token, slot) assignments by expert — and its backward, as Transformers'
// Qwen3MoeTopKRouter computes them. The built-in MoeMLP and the load-balancing loss use it.
//
// Precision: in `f32` mode every step is f32 (Transformers' softmax(dtype=float), topk, division),
// in f64 mode (the f64 reference path of finite-difference tests) everything is double. The
// grouping is the canonical order of hk's moe_mlp@1 interface: experts ascending, and within one
// expert the assignments by increasing t·k + slot. Nothing here touches a device.
#pragma once

#include <cstdint>
#include <vector>

namespace hk::nn::moe {

struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0;
  std::vector<double> probs;    // [T, E] softmax of the logits (f32-rounded in f32 mode)
  std::vector<int32_t> ids;     // [T, k] experts by descending probability, ties: lower index
  std::vector<double> weights;  // [T, k] the top-k probabilities, renormalised when asked
  // Grouping by expert.
  std::vector<int64_t> offsets;       // [E + 1] first sorted row of each expert
  std::vector<int64_t> sorted_token;  // [T·k] token of each sorted row
  std::vector<int64_t> sorted_slot;   // [T·k] t·k + slot of each sorted row
  std::vector<int64_t> position;      // [T·k] sorted row of assignment t·k + slot
};

// `logits` [T, E] row-major. f32 = false computes in double.
Routing route(const std::vector<double>& logits, int64_t tokens, int64_t experts, int64_t top_k,
              bool norm_topk_prob, bool f32);

// Top-k of one probability row (descending, ties to the lower index) into ids[0..k).
void top_k_row(const double* probs, int64_t experts, int64_t top_k, int32_t* ids);

// d(logits) [T, E] from d(weights) [T, k] (the gradient of each top-k weight): through the
// renormalisation, the gather of the top-k probabilities and the softmax.
std::vector<double> route_backward(const Routing& routing, const std::vector<double>& dweights,
                                   bool norm_topk_prob);

// Rows of the softmax of `logits` [rows, E] (f32-rounded when f32).
std::vector<double> softmax_rows(const std::vector<double>& logits, int64_t rows, int64_t cols,
                                 bool f32);

}  // namespace hk::nn::moe
