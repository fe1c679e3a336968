// CUDA multi-scale deformable attention, forward and backward (the built-in of layer interface
// multi_scale_deformable_attention@1; the formula is in hk/layer_interfaces.h).
//
// Simple on purpose ("eager"): the forward runs one thread per output element (b, q, h, d),
// looping over levels and points; the backward runs one thread per (b, q, h, d) to scatter
// dvalue with f32 atomics (into dvalue itself when it is a contiguous f32 tensor, else an f32
// temporary cast back once), and one thread per sampling point (b, q, h, l, p) for d(location)
// and d(weight), reducing over d itself. Inputs that are not contiguous are copied first; atomic
// order makes dvalue's last bits run-to-run nondeterministic, as in PyTorch. At most 16 levels.
#include "hk/deformable_sampling.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"

namespace hk::ops::cuda {
namespace {
using namespace detail;
using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;

constexpr int kMaxLevels = 16;
constexpr int kThreads = 256;

struct Levels {
  int n;
  int64_t height[kMaxLevels], width[kMaxLevels], start[kMaxLevels];
};

struct Problem {
  int64_t b, s, h, d, q, l, p;
  Levels levels;
};

using Corners = deformable::Corners<float>;
__device__ __forceinline__ Corners corners(float loc_x, float loc_y, int64_t height,
                                           int64_t width) {
  return deformable::corners<float>(loc_x, loc_y, height, width);
}

__global__ void forward_kernel(Problem pb, const void* __restrict__ value,
                               const void* __restrict__ loc, const void* __restrict__ att, DType dt,
                               void* __restrict__ out) {
  const int64_t n = pb.b * pb.q * pb.h * pb.d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % pb.d, bqh = i / pb.d, h = bqh % pb.h, b = bqh / (pb.h * pb.q);
    float acc = 0.0f;
    for (int l = 0; l < pb.l; ++l)
      for (int64_t p = 0; p < pb.p; ++p) {
        const int64_t j = (bqh * pb.l + l) * pb.p + p;
        const Corners c = corners(load_f32(loc, dt, 2 * j), load_f32(loc, dt, 2 * j + 1),
                                  pb.levels.height[l], pb.levels.width[l]);
        const float a = load_f32(att, dt, j);
        for (int k = 0; k < 4; ++k)
          if (c.row[k] >= 0)
            acc += a * c.w[k] *
                   load_f32(value, dt,
                            ((b * pb.s + pb.levels.start[l] + c.row[k]) * pb.h + h) * pb.d + d);
      }
    store_f32(out, dt, i, acc);
  }
}

__global__ void dvalue_kernel(Problem pb, const void* __restrict__ dout,
                              const void* __restrict__ loc, const void* __restrict__ att, DType dt,
                              float* __restrict__ dvalue) {
  const int64_t n = pb.b * pb.q * pb.h * pb.d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % pb.d, bqh = i / pb.d, h = bqh % pb.h, b = bqh / (pb.h * pb.q);
    const float g = load_f32(dout, dt, i);
    if (g == 0.0f) continue;
    for (int l = 0; l < pb.l; ++l)
      for (int64_t p = 0; p < pb.p; ++p) {
        const int64_t j = (bqh * pb.l + l) * pb.p + p;
        const Corners c = corners(load_f32(loc, dt, 2 * j), load_f32(loc, dt, 2 * j + 1),
                                  pb.levels.height[l], pb.levels.width[l]);
        const float a = load_f32(att, dt, j);
        for (int k = 0; k < 4; ++k)
          if (c.row[k] >= 0)
            atomicAdd(dvalue + ((b * pb.s + pb.levels.start[l] + c.row[k]) * pb.h + h) * pb.d + d,
                      a * c.w[k] * g);
      }
  }
}

__global__ void dpoint_kernel(Problem pb, const void* __restrict__ dout,
                              const void* __restrict__ value, const void* __restrict__ loc,
                              const void* __restrict__ att, DType dt, void* __restrict__ dloc,
                              void* __restrict__ datt) {
  const int64_t n = pb.b * pb.q * pb.h * pb.l * pb.p;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = (j / pb.p) % pb.l, bqh = j / (pb.p * pb.l), h = bqh % pb.h,
                  b = bqh / (pb.h * pb.q);
    const int64_t height = pb.levels.height[l], width = pb.levels.width[l];
    const Corners c =
        corners(load_f32(loc, dt, 2 * j), load_f32(loc, dt, 2 * j + 1), height, width);
    float sample_dot = 0.0f, gx = 0.0f, gy = 0.0f;
    for (int k = 0; k < 4; ++k) {
      if (c.row[k] < 0) continue;
      const int64_t base = ((b * pb.s + pb.levels.start[l] + c.row[k]) * pb.h + h) * pb.d;
      float dot = 0.0f;
      for (int64_t d = 0; d < pb.d; ++d)
        dot += load_f32(dout, dt, bqh * pb.d + d) * load_f32(value, dt, base + d);
      sample_dot += c.w[k] * dot;
      gx += c.dwx[k] * dot;
      gy += c.dwy[k] * dot;
    }
    const float a = load_f32(att, dt, j);
    if (datt) store_f32(datt, dt, j, sample_dot);
    if (dloc) {
      store_f32(dloc, dt, 2 * j, a * gx * static_cast<float>(width));
      store_f32(dloc, dt, 2 * j + 1, a * gy * static_cast<float>(height));
    }
  }
}

Problem problem_of(const TensorView& value, const SpatialShapes& shapes, const TensorView& loc) {
  if (shapes.size() > static_cast<size_t>(kMaxLevels))
    throw Unsupported("ms_deform_attn: the cuda built-in takes at most 16 levels, got " +
                      std::to_string(shapes.size()));
  Problem p{value.shape[0], value.shape[1], value.shape[2], value.shape[3],
            loc.shape[1],   loc.shape[3],   loc.shape[4],   {}};
  p.levels.n = static_cast<int>(shapes.size());
  int64_t start = 0;
  for (size_t l = 0; l < shapes.size(); ++l) {
    p.levels.height[l] = shapes[l].first;
    p.levels.width[l] = shapes[l].second;
    p.levels.start[l] = start;
    start += shapes[l].first * shapes[l].second;
  }
  return p;
}

}  // namespace

void ms_deform_attn(const TensorView& value, const SpatialShapes& spatial_shapes,
                    const TensorView& sampling_locations, const TensorView& attention_weights,
                    const TensorView& out, Stream stream) {
  if (out.numel() == 0) return;
  DeviceGuard guard(value.device);
  const Problem pb = problem_of(value, spatial_shapes, sampling_locations);
  Tensor kv, kl, ka;
  const TensorView v = contiguous_input(value, kv, stream);
  const TensorView l = contiguous_input(sampling_locations, kl, stream);
  const TensorView a = contiguous_input(attention_weights, ka, stream);
  WritableOutput o(out, true, false, stream);
  forward_kernel<<<grid_for(out.numel(), kThreads), kThreads, 0, native(stream)>>>(
      pb, v.ptr(), l.ptr(), a.ptr(), value.dtype, o.view().ptr());
  HK_CUDA_CHECK_LAUNCH();
  o.finish(stream);
}

void ms_deform_attn_backward(const TensorView& dout, const TensorView& value,
                             const SpatialShapes& spatial_shapes,
                             const TensorView& sampling_locations,
                             const TensorView& attention_weights, const TensorView* dvalue,
                             const TensorView* dsampling_locations,
                             const TensorView* dattention_weights, Stream stream) {
  DeviceGuard guard(value.device);
  const Problem pb = problem_of(value, spatial_shapes, sampling_locations);
  Tensor kd, kv, kl, ka;
  const TensorView g = contiguous_input(dout, kd, stream);
  const TensorView v = contiguous_input(value, kv, stream);
  const TensorView l = contiguous_input(sampling_locations, kl, stream);
  const TensorView a = contiguous_input(attention_weights, ka, stream);
  if (dvalue && dvalue->numel() > 0) {
    const bool direct = dvalue->dtype == DType::F32 && dvalue->is_contiguous();
    Tensor acc;
    const TensorView target =
        direct ? *dvalue
               : (acc = Tensor::empty(dvalue->sizes(), DType::F32, dvalue->device, stream)).view();
    HK_CUDA_CHECK(cudaMemsetAsync(target.ptr(), 0, target.numel() * sizeof(float), native(stream)));
    if (dout.numel() > 0) {
      dvalue_kernel<<<grid_for(dout.numel(), kThreads), kThreads, 0, native(stream)>>>(
          pb, g.ptr(), l.ptr(), a.ptr(), value.dtype, static_cast<float*>(target.ptr()));
      HK_CUDA_CHECK_LAUNCH();
    }
    if (!direct) cast(target, *dvalue, stream);
  }
  if ((dsampling_locations || dattention_weights) && attention_weights.numel() > 0) {
    std::optional<WritableOutput> ol, oa;
    if (dsampling_locations) ol.emplace(*dsampling_locations, true, false, stream);
    if (dattention_weights) oa.emplace(*dattention_weights, true, false, stream);
    dpoint_kernel<<<grid_for(attention_weights.numel(), kThreads), kThreads, 0, native(stream)>>>(
        pb, g.ptr(), v.ptr(), l.ptr(), a.ptr(), value.dtype, ol ? ol->view().ptr() : nullptr,
        oa ? oa->view().ptr() : nullptr);
    HK_CUDA_CHECK_LAUNCH();
    if (ol) ol->finish(stream);
    if (oa) oa->finish(stream);
  }
}

}  // namespace hk::ops::cuda
