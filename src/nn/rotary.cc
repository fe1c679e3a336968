// Rotary position embedding: the model-level cos/sin tables (`model.rotary_emb`) and the
// per-attention `rotary_pos_emb` function (`self_attn.rotary_fn`).
//
// Default RoPE tables come from ops::rotary_tables on the model's device (f32, Transformers'
// formula). Scaled rope types (Llama 3) get their inverse frequencies and tables computed on the
// host in f32 exactly as Transformers does, then copied to the device. Applying the rotation is the
// layer interface; its built-in implementation is ops::rotary_embedding.
#include <cmath>

#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinRotaryApply final : public RotaryApplyImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const RotaryApply&, const TensorView& q, const TensorView& k, const TensorView& cos,
               const TensorView& sin, Stream stream) const override {
    ops::rotary_embedding(q, cos, sin, q, stream);
    ops::rotary_embedding(k, cos, sin, k, stream);
  }
  bool supports_training() const override { return true; }
  void forward_train(const RotaryApply& layer, const Tensor& q, const Tensor& k, const Tensor& cos,
                     const Tensor& sin, LayerContext&, Stream stream) const override {
    forward(layer, q, k, cos, sin, stream);
  }
  // The rotation is linear: its backward is the transposed rotation (nothing saved).
  void backward(const RotaryApply&, const Tensor& cos, const Tensor& sin, LayerContext&,
                const Tensor& dq, const Tensor& dk, Stream stream) const override {
    ops::rotary_embedding_backward(dq, cos, sin, dq, stream);
    ops::rotary_embedding_backward(dk, cos, sin, dk, stream);
  }
};

std::vector<float> compute_inv_freq(int64_t head_dim, const RopeParameters& rope) {
  HK_CHECK(head_dim > 0 && head_dim % 2 == 0,
           "rotary embedding needs an even head_dim, got " + std::to_string(head_dim));
  const float base = static_cast<float>(rope.rope_theta);
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in f32
    float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  if (rope.rope_type == "default") return inv;
  if (rope.rope_type == "llama3") {
    const double pi = 3.14159265358979323846;
    const double old_len = static_cast<double>(rope.original_max_position_embeddings);
    const double low_wavelen = old_len / rope.low_freq_factor;
    const double high_wavelen = old_len / rope.high_freq_factor;
    for (float& f : inv) {
      // Mirrors Transformers' f32 tensor math: wavelen = 2π / inv_freq.
      float wavelen = static_cast<float>(2 * pi) / f;
      float scaled = wavelen > low_wavelen ? f / static_cast<float>(rope.factor) : f;
      bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        float smooth = static_cast<float>((old_len / wavelen - rope.low_freq_factor) /
                                          (rope.high_freq_factor - rope.low_freq_factor));
        scaled = (1 - smooth) * scaled / static_cast<float>(rope.factor) + smooth * scaled;
      }
      f = scaled;
    }
    return inv;
  }
  throw Unsupported("rope_type '" + rope.rope_type +
                    "' is not supported; supported rope types: default, llama3");
}

}  // namespace

RotaryApply::RotaryApply()
    : LayerModule("RotaryPosEmb", "rotary_pos_emb", std::make_shared<BuiltinRotaryApply>()) {}

RotaryEmbedding::RotaryEmbedding(std::string type_name, int64_t head_dim, RopeParameters rope)
    : Module(std::move(type_name)),
      head_dim_(head_dim),
      rope_(std::move(rope)),
      inv_freq_(compute_inv_freq(head_dim, rope_)) {}

void RotaryEmbedding::tables(const Tensor& positions, Device device, Tensor& cos, Tensor& sin,
                             Stream stream) const {
  HK_CHECK(positions.ndim() == 2,
           "rotary tables: positions must be [batch, seq], got " + positions.view().str());
  if (rope_.rope_type == "default") {
    // The built-in op computes the same f32 tables on the device: no host work for long prefills.
    Tensor on_device = positions.device() == device ? positions : positions.to(device, stream);
    cos = Tensor::empty({positions.size(0), positions.size(1), head_dim_}, DType::F32, device,
                        stream);
    sin = Tensor::empty({positions.size(0), positions.size(1), head_dim_}, DType::F32, device,
                        stream);
    ops::rotary_tables(on_device, head_dim_, rope_.rope_theta, 1.0f, cos, sin, stream);
    return;
  }
  Tensor host_positions =
      positions.device().is_cpu() ? positions : positions.to(Device::cpu(), stream);
  std::vector<int64_t> pos = host_positions.to_int64s();
  const int64_t b = positions.size(0), s = positions.size(1), d = head_dim_, half = d / 2;
  Tensor c = Tensor::empty({b, s, d}, DType::F32);
  Tensor sn = Tensor::empty({b, s, d}, DType::F32);
  float* cp = c.data_as<float>();
  float* sp = sn.data_as<float>();
  for (int64_t r = 0; r < b * s; ++r) {
    const float p = static_cast<float>(pos[static_cast<size_t>(r)]);
    for (int64_t i = 0; i < half; ++i) {
      const float freq = inv_freq_[static_cast<size_t>(i)] * p;  // f32 product, like the matmul
      const float cv = std::cos(freq), sv = std::sin(freq);
      cp[r * d + i] = cp[r * d + i + half] = cv;
      sp[r * d + i] = sp[r * d + i + half] = sv;
    }
  }
  if (device.is_cpu()) {
    cos = c;
    sin = sn;
  } else {
    cos = c.to(device, stream);
    sin = sn.to(device, stream);
  }
}

}  // namespace hk::nn
