// msda_cpu_library.cc — kernels-community/deformable-detr, cpu variant: entry
// MultiScaleDeformableAttention (multi_scale_deformable_attention@1), forward and backward.
// Loops over (b, q, h, l, p) with the corner rule of msda_problem.h, f32 math, one rounding per
// output; dvalue summed in an f32 buffer. A portable variant, not a fast one.
#include <vector>

#include "msda_call.h"

namespace {

using msda::Problem;

using hk::sdk::load_float;
using hk::sdk::store_float;

int64_t value_index(const Problem& p, int64_t b, int64_t l, int64_t row, int64_t h) {
  return ((b * p.rows + p.start[l] + row) * p.heads + h) * p.channels;
}

void forward(const hk_call& call) {
  Problem p = msda::problem_of(call, 0, HK_DEVICE_CPU);
  p.out = msda::checked_bqc(hk::sdk::output(call, 0, "out"), "out", p, HK_DEVICE_CPU);
  std::vector<float> acc(static_cast<size_t>(p.channels));
  for (int64_t bqh = 0; bqh < p.batch * p.queries * p.heads; ++bqh) {
    const int64_t h = bqh % p.heads, b = bqh / (p.heads * p.queries);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t l = 0; l < p.levels; ++l)
      for (int64_t pt = 0; pt < p.points; ++pt) {
        const int64_t j = (bqh * p.levels + l) * p.points + pt;
        const msda::Corners c =
            msda::corners(load_float(p.loc, p.dtype, 2 * j), load_float(p.loc, p.dtype, 2 * j + 1),
                          p.height[l], p.width[l]);
        const float a = load_float(p.att, p.dtype, j);
        for (int k = 0; k < 4; ++k) {
          if (c.row[k] < 0) continue;
          const int64_t v = value_index(p, b, l, c.row[k], h);
          for (int64_t d = 0; d < p.channels; ++d)
            acc[d] += a * c.w[k] * load_float(p.value, p.dtype, v + d);
        }
      }
    for (int64_t d = 0; d < p.channels; ++d)
      store_float(p.out, p.dtype, bqh * p.channels + d, acc[d]);
  }
}

void backward(const hk_call& call) {
  Problem p = msda::problem_of(call, 1, HK_DEVICE_CPU);
  p.dout = msda::checked_bqc(hk::sdk::input(call, 0, "dout"), "dout", p, HK_DEVICE_CPU);
  msda::backward_outputs(call, p, HK_DEVICE_CPU);
  std::vector<float> dvalue(
      p.dvalue ? static_cast<size_t>(p.batch * p.rows * p.heads * p.channels) : 0, 0.0f);
  for (int64_t bqh = 0; bqh < p.batch * p.queries * p.heads; ++bqh) {
    const int64_t h = bqh % p.heads, b = bqh / (p.heads * p.queries);
    for (int64_t l = 0; l < p.levels; ++l)
      for (int64_t pt = 0; pt < p.points; ++pt) {
        const int64_t j = (bqh * p.levels + l) * p.points + pt;
        const msda::Corners c =
            msda::corners(load_float(p.loc, p.dtype, 2 * j), load_float(p.loc, p.dtype, 2 * j + 1),
                          p.height[l], p.width[l]);
        const float a = load_float(p.att, p.dtype, j);
        float sample_dot = 0.0f, gx = 0.0f, gy = 0.0f;
        for (int k = 0; k < 4; ++k) {
          if (c.row[k] < 0) continue;
          const int64_t v = value_index(p, b, l, c.row[k], h);
          float dot = 0.0f;
          for (int64_t d = 0; d < p.channels; ++d) {
            const float g = load_float(p.dout, p.dtype, bqh * p.channels + d);
            dot += g * load_float(p.value, p.dtype, v + d);
            if (p.dvalue) dvalue[v + d] += a * c.w[k] * g;
          }
          sample_dot += c.w[k] * dot;
          gx += c.dwx[k] * dot;
          gy += c.dwy[k] * dot;
        }
        if (p.datt) store_float(p.datt, p.dtype, j, sample_dot);
        if (p.dloc) {
          store_float(p.dloc, p.dtype, 2 * j, a * gx * static_cast<float>(p.width[l]));
          store_float(p.dloc, p.dtype, 2 * j + 1, a * gy * static_cast<float>(p.height[l]));
        }
      }
  }
  for (size_t i = 0; i < dvalue.size(); ++i)
    store_float(p.dvalue, p.dtype, static_cast<int64_t>(i), dvalue[i]);
}

const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
    .name = "MultiScaleDeformableAttention",
    .interface = "multi_scale_deformable_attention",
    .interface_version = 1,
    .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING,
    .device = "cpu",
    .dtypes = hk::sdk::kFloatDtypes,
    .forward = hk::sdk::entry_point<forward>,
    .backward = hk::sdk::entry_point<backward>,
})};

}  // namespace

HK_KERNEL_LIBRARY(kEntries)
