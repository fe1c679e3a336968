// MoE block problems shared by the emulated-device test of megablocks' cuda variant
// (test_megablocks_cuda_emulated.cc) and the GPU test (tests/gpu/test_moe_gpu.cc): uneven routings
// and shapes across every tile edge of the grouped GEMMs, with their input values.
//
// Values are small multiples of powers of two, exact in bf16 and f16; x, router_w and gate_up_w are
// chosen so that the router and gate_up GEMMs are exact in f32 whatever the summation order, so
// every implementation routes identically and must agree bit for bit on the router logits, the
// top-k and the gate_up pre-activations. Header-only, no hk dependency.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace hk::test {

struct MoeProblem {
  const char* name;
  int64_t T, E, k, H, I;
  bool norm;
  int routing;  // 0 random, 1 experts ≥ E/2 get nothing, 2 expert 1 is everyone's first choice
};

inline constexpr MoeProblem kMoeProblems[] = {
    {"random", 37, 8, 2, 48, 24, true, 0},
    {"dead_experts", 29, 8, 2, 48, 24, false, 1},
    {"one_expert_all_k1", 23, 4, 1, 48, 24, false, 2},
    {"top_k_is_e", 19, 4, 4, 48, 24, true, 0},
    {"single_token", 1, 8, 2, 48, 24, true, 0},
    // 1400 assignments: the permutation over two chunks of 1024
    {"two_chunks", 700, 8, 2, 48, 24, true, 0},
    // two M tiles per expert (150 rows), K tail (264 = 8·32 + 8), N tails (I 72)
    {"tile_edges", 300, 2, 1, 264, 72, false, 0},
    // (GPU only from here: too slow to emulate) many tiles, odd token count
    {"odd_tokens", 1001, 16, 4, 512, 200, true, 0},
    // the wgmma tiles' edges: K tails past 64-wide k-tiles and a pipeline of 17 of them (H 1032 =
    // 16·64 + 8; 2I 272 = 4·64 + 16), N tails past 128 and 64 (SwiGLU) columns (I 136 = 2·64 + 8,
    // H), ~300 rows per expert (3 M tiles, the last partial)
    {"wgmma_edges", 600, 4, 2, 1032, 136, true, 0},
};

struct MoeProblemValues {
  std::vector<float> x, wr, wgu, wd, dy, drouter;  // [T,H] [E,H] [E,2I,H] [E,H,I] [T,H] [T,E]
};

inline MoeProblemValues moe_problem_values(const MoeProblem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  MoeProblemValues v;
  v.x.resize(p.T * p.H);
  v.wr.resize(p.E * p.H);
  v.wgu.resize(p.E * 2 * p.I * p.H);
  v.wd.resize(p.E * p.H * p.I);
  v.dy.resize(p.T * p.H);
  v.drouter.resize(p.T * p.E);
  for (auto& e : v.x) e = (p.routing ? pick(1, 4) : pick(-4, 4)) / 8.0f;
  for (auto& e : v.wr) e = pick(-8, 8) / 64.0f;
  for (int64_t e = 0; e < p.E; ++e)
    for (int64_t h = 0; h < p.H; ++h) {
      if (p.routing == 1 && e >= p.E / 2) v.wr[e * p.H + h] = -0.5f;
      if (p.routing == 2 && e == 1) v.wr[e * p.H + h] = 0.5f;
    }
  for (auto& e : v.wgu) e = pick(-3, 3) / 16.0f;
  for (auto& e : v.wd) e = pick(-3, 3) / 16.0f;
  for (auto& e : v.dy) e = pick(-4, 4) / 8.0f;
  for (auto& e : v.drouter) e = pick(-4, 4) / 64.0f;
  return v;
}

}  // namespace hk::test
