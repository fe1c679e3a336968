// moe_cpu.cc — the cpu variant of kernels-community/megablocks: entry MegaBlocksMoeMLP, moe_mlp@1.
//
// The same pipeline as the cuda variant, as plain loops: router GEMM, routing (routing.h's
// route_row), the three-phase permutation (routing.h, run here chunk by chunk), the experts over
// their sorted rows (gate_up GEMM, act(gate)·up, down GEMM), and the weighted un-permutation;
// backward mirrors it (d(weights) as ⟨dy·down_w, a⟩, so the expert outputs are not recomputed).
// f32 math with the interface's roundings; any of f32/bf16/f16. Single-threaded on purpose: it is
// the portable reference variant (and checks the permutation logic the cuda kernels share), not a
// fast one — hk's built-in MoE block (OpenBLAS per expert) is the faster cpu path.
#include <cstring>
#include <vector>

#include "moe_call.h"
#include "routing.h"

namespace megablocks {
namespace {

float load(const void* base, int32_t dtype, int64_t i) {
  switch (dtype) {
    case HK_DTYPE_BF16:
      return hk::bf16_to_float(static_cast<const hk::bf16_t*>(base)[i]);
    case HK_DTYPE_F16:
      return static_cast<float>(static_cast<const _Float16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

void store(void* base, int32_t dtype, int64_t i, float v) {
  switch (dtype) {
    case HK_DTYPE_BF16:
      static_cast<hk::bf16_t*>(base)[i] = hk::float_to_bf16(v);
      break;
    case HK_DTYPE_F16:
      static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

float round_to(int32_t dtype, float v) {
  switch (dtype) {
    case HK_DTYPE_BF16:
      return hk::bf16_to_float(hk::float_to_bf16(v));
    case HK_DTYPE_F16:
      return static_cast<float>(static_cast<_Float16>(v));
    default:
      return v;
  }
}

// A dense matrix of the call's dtype read as f32.
struct Mat {
  const void* p;
  int32_t dtype;
  int64_t cols;
  float at(int64_t r, int64_t c) const { return load(p, dtype, r * cols + c); }
};

// The routing and its canonical permutation (the cuda variant's phases 1-3, chunk by chunk).
struct Routed {
  std::vector<int32_t> ids;          // [T·k]
  std::vector<float> weights;        // [T·k] f32, before rounding
  std::vector<int64_t> offsets;      // [E + 1]
  std::vector<int64_t> position;     // [T·k] sorted row of each assignment
  std::vector<int64_t> sorted_slot;  // [T·k] assignment of each sorted row
};

// Phases 1-3 over the flat expert ids.
void permute(const MoeCall& c, Routed& r) {
  const int64_t n = c.assignments(), chunks = num_chunks(n);
  const int32_t E = static_cast<int32_t>(c.E);
  std::vector<int32_t> hist(static_cast<size_t>(chunks * E), 0), rank(n);
  for (int64_t a = 0; a < n; ++a) {  // phase 1
    rank[a] = chunk_rank(r.ids.data() + (a - a % kChunk), static_cast<int32_t>(a % kChunk));
    ++hist[(a / kChunk) * E + r.ids[a]];
  }
  std::vector<int64_t> counts(E), tiles(E + 1);
  for (int32_t e = 0; e < E; ++e) counts[e] = chunk_prefix(hist.data(), chunks, E, e);  // phase 2
  r.offsets.resize(E + 1);
  expert_offsets(counts.data(), E, 1, r.offsets.data(), tiles.data());
  r.position.resize(n);
  r.sorted_slot.resize(n);
  for (int64_t a = 0; a < n; ++a) {  // phase 3
    r.position[a] = sorted_row(r.ids.data(), hist.data(), r.offsets.data(), E, a, rank[a]);
    r.sorted_slot[r.position[a]] = a;
  }
}

Routed route_all(const MoeCall& c, const void* logits) {
  Routed r;
  r.ids.resize(c.assignments());
  r.weights.resize(c.assignments());
  for (int64_t t = 0; t < c.T; ++t) {
    auto logit = [&](int32_t e) { return load(logits, c.dtype, t * c.E + e); };
    route_row(logit, static_cast<int32_t>(c.E), static_cast<int32_t>(c.k),
              c.attrs.norm_topk_prob != 0, &r.ids[t * c.k], &r.weights[t * c.k]);
  }
  permute(c, r);
  return r;
}

// The forward's saved routing (backward): its ids, permuted again.
Routed saved_routing(const MoeCall& c) {
  Routed r;
  r.ids.assign(c.topk_ids, c.topk_ids + c.assignments());
  for (int32_t e : r.ids)
    if (e < 0 || e >= c.E)
      fail(HK_STATUS_INVALID_ARGUMENT,
           "moe_mlp backward: topk_ids holds expert " + std::to_string(e) + ", outside [0, E)");
  r.weights.assign(c.topk_weights, c.topk_weights + c.assignments());
  permute(c, r);
  return r;
}

void forward(const hk_call& call) {
  const MoeCall c = parse_forward(call, HK_DEVICE_CPU);
  const int64_t T = c.T, H = c.H, E = c.E, I = c.I, k = c.k;
  const Mat x{c.x, c.dtype, H}, wr{c.router_w, c.dtype, H};
  // Router logits, rounded to the dtype.
  std::vector<char> logits_scratch;
  void* logits = c.router_logits;
  if (!logits) {
    logits_scratch.resize(static_cast<size_t>(T * E) * hk::sdk::dtype_code_size(c.dtype));
    logits = logits_scratch.data();
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += x.at(t, h) * wr.at(e, h);
      store(logits, c.dtype, t * E + e, acc);
    }
  const Routed r = route_all(c, logits);
  if (c.topk_ids) std::memcpy(c.topk_ids, r.ids.data(), r.ids.size() * sizeof(int32_t));
  if (c.topk_weights)
    std::memcpy(c.topk_weights, r.weights.data(), r.weights.size() * sizeof(float));

  std::vector<float> y(static_cast<size_t>(T * H), 0.0f), h(2 * I), a(I);
  for (int64_t e = 0; e < E; ++e) {
    const Mat wgu{
        static_cast<const char*>(c.gate_up_w) + e * 2 * I * H * hk::sdk::dtype_code_size(c.dtype),
        c.dtype, H};
    const Mat wd{static_cast<const char*>(c.down_w) + e * H * I * hk::sdk::dtype_code_size(c.dtype),
                 c.dtype, I};
    for (int64_t row = r.offsets[e]; row < r.offsets[e + 1]; ++row) {
      const int64_t slot = r.sorted_slot[row], t = slot / k;
      for (int64_t i = 0; i < 2 * I; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < H; ++j) acc += x.at(t, j) * wgu.at(i, j);
        h[i] = round_to(c.dtype, acc);
        if (c.gate_up) store(c.gate_up, c.dtype, row * 2 * I + i, acc);
      }
      for (int64_t i = 0; i < I; ++i)
        a[i] = round_to(c.dtype, round_to(c.dtype, act(c.attrs.activation, h[i])) * h[I + i]);
      const float w = round_to(c.dtype, r.weights[slot]);
      for (int64_t j = 0; j < H; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < I; ++i) acc += a[i] * wd.at(j, i);
        y[t * H + j] += round_to(c.dtype, w * round_to(c.dtype, acc));
      }
    }
  }
  for (int64_t i = 0; i < T * H; ++i) store(c.y, c.dtype, i, y[i]);
}

// dweight (+)= f32 accumulator, rounded once.
void write_grad(void* dst, int32_t dtype, const std::vector<float>& g, bool accumulate) {
  for (size_t i = 0; i < g.size(); ++i)
    store(dst, dtype, static_cast<int64_t>(i),
          accumulate ? load(dst, dtype, static_cast<int64_t>(i)) + g[i] : g[i]);
}

void backward(const hk_call& call) {
  const MoeCall c = parse_backward(call, HK_DEVICE_CPU);
  const int64_t T = c.T, H = c.H, E = c.E, I = c.I, k = c.k;
  const size_t es = hk::sdk::dtype_code_size(c.dtype);
  const Mat x{c.x, c.dtype, H}, dy{c.dy, c.dtype, H}, wr{c.router_w, c.dtype, H};
  const Mat gate_up{c.gate_up, c.dtype, 2 * I};
  const Routed r = saved_routing(c);

  std::vector<float> dx(static_cast<size_t>(T * H), 0.0f), dweights(c.assignments(), 0.0f);
  std::vector<float> dgu(c.dgate_up_w ? static_cast<size_t>(E * 2 * I * H) : 0, 0.0f);
  std::vector<float> ddown(c.ddown_w ? static_cast<size_t>(E * H * I) : 0, 0.0f);
  std::vector<float> d(I), dh(2 * I);
  for (int64_t e = 0; e < E; ++e) {
    const Mat wgu{static_cast<const char*>(c.gate_up_w) + e * 2 * I * H * es, c.dtype, H};
    const Mat wd{static_cast<const char*>(c.down_w) + e * H * I * es, c.dtype, I};
    for (int64_t row = r.offsets[e]; row < r.offsets[e + 1]; ++row) {
      const int64_t slot = r.sorted_slot[row], t = slot / k;
      const float w = round_to(c.dtype, r.weights[slot]);
      float dweight = 0.0f;
      for (int64_t i = 0; i < I; ++i) {
        float acc = 0.0f;  // d = dy[t]·down_w[e]
        for (int64_t j = 0; j < H; ++j) acc += dy.at(t, j) * wd.at(j, i);
        d[i] = acc;
        const float g = gate_up.at(row, i), u = gate_up.at(row, I + i);
        const float s = round_to(c.dtype, act(c.attrs.activation, g));
        const float a = round_to(c.dtype, s * u);
        dweight += acc * a;
        const float da = w * acc;
        dh[i] = da * u * act_grad(c.attrs.activation, g);
        dh[I + i] = da * s;
        if (c.ddown_w)
          for (int64_t j = 0; j < H; ++j) ddown[(e * H + j) * I + i] += w * dy.at(t, j) * a;
      }
      dweights[slot] = dweight;
      for (int64_t j = 0; j < H; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < 2 * I; ++i) acc += dh[i] * wgu.at(i, j);
        dx[t * H + j] += acc;
      }
      if (c.dgate_up_w)
        for (int64_t i = 0; i < 2 * I; ++i)
          for (int64_t j = 0; j < H; ++j) dgu[(e * 2 * I + i) * H + j] += dh[i] * x.at(t, j);
    }
  }

  // The routing: d(weights) → d(probabilities) → d(logits) (+ drouter_logits).
  std::vector<float> dlogits(static_cast<size_t>(T * E), 0.0f), p(E), dp(E);
  for (int64_t t = 0; t < T; ++t) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) m = std::fmax(m, load(c.router_logits, c.dtype, t * E + e));
    for (int64_t e = 0; e < E; ++e)
      sum += (p[e] = std::exp(load(c.router_logits, c.dtype, t * E + e) - m));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::fill(dp.begin(), dp.end(), 0.0f);
    const int32_t* id = &r.ids[t * k];
    const float* dw = &dweights[t * k];
    if (c.attrs.norm_topk_prob) {
      float s = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        s += p[id[j]];
        dot += dw[j] * r.weights[t * k + j];
      }
      for (int64_t j = 0; j < k; ++j) dp[id[j]] += (dw[j] - dot) / s;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[id[j]] += dw[j];
    }
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) {
      float g = p[e] * (dp[e] - dot);
      if (c.drouter_logits) g += c.drouter_logits[t * E + e];
      dlogits[t * E + e] = round_to(c.dtype, g);  // the logits' gradient has their dtype
    }
  }
  std::vector<float> dwr(c.drouter_w ? static_cast<size_t>(E * H) : 0, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const float g = dlogits[t * E + e];
      if (g == 0.0f) continue;
      for (int64_t j = 0; j < H; ++j) {
        dx[t * H + j] += g * wr.at(e, j);
        if (c.drouter_w) dwr[e * H + j] += g * x.at(t, j);
      }
    }
  for (int64_t i = 0; i < T * H; ++i) store(c.dx, c.dtype, i, dx[i]);
  if (c.drouter_w) write_grad(c.drouter_w, c.dtype, dwr, c.accumulate);
  if (c.dgate_up_w) write_grad(c.dgate_up_w, c.dtype, dgu, c.accumulate);
  if (c.ddown_w) write_grad(c.ddown_w, c.dtype, ddown, c.accumulate);
}

}  // namespace
}  // namespace megablocks

static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "MegaBlocksMoeMLP",
    .interface = "moe_mlp",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING,
    .device = "cpu",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<megablocks::forward>,
    .backward = hk::sdk::entry_point<megablocks::backward>,
})};

HK_KERNEL_LIBRARY(kEntries)
