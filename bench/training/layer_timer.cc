// LayerTimer (layer_timer.h): timing proxies for every layer interface of hk/layers.h.
#include "layer_timer.h"

#include <algorithm>
#include <map>

#include "hk/layers.h"

namespace hk::bench {

struct LayerTimer::Record {
  std::string label;
  ptrdiff_t parent = -1;
  Event start, end;
};

LayerTimer::LayerTimer(Stream stream) : stream_(stream) {}

LayerTimer::~LayerTimer() {
  uninstall();
}

LayerTimer::Scope::Scope(LayerTimer& timer, std::string label) : timer_(timer) {
  auto r = std::make_unique<Record>();
  r->label = std::move(label);
  r->parent = timer.open_.empty() ? -1 : static_cast<ptrdiff_t>(timer.open_.back());
  r->start.record(timer.stream_);
  index_ = timer.records_.size();
  timer.records_.push_back(std::move(r));
  timer.open_.push_back(index_);
}

LayerTimer::Scope::~Scope() {
  timer_.records_[index_]->end.record(timer_.stream_);
  timer_.open_.pop_back();
}

void LayerTimer::clear() {
  records_.clear();
  open_.clear();
}

std::vector<LayerTimer::Row> LayerTimer::rows() const {
  std::vector<double> duration(records_.size()), children(records_.size(), 0.0);
  for (size_t i = 0; i < records_.size(); ++i) {
    duration[i] = Event::elapsed_ms(records_[i]->start, records_[i]->end);
    if (records_[i]->parent >= 0) children[static_cast<size_t>(records_[i]->parent)] += duration[i];
  }
  std::map<std::string, Row> by_label;
  for (size_t i = 0; i < records_.size(); ++i) {
    Row& row = by_label[records_[i]->label];
    row.label = records_[i]->label;
    ++row.calls;
    row.inclusive_ms += duration[i];
    row.exclusive_ms += std::max(0.0, duration[i] - children[i]);
  }
  std::vector<Row> out;
  for (auto& [label, row] : by_label) out.push_back(row);
  std::sort(out.begin(), out.end(),
            [](const Row& a, const Row& b) { return a.exclusive_ms > b.exclusive_ms; });
  return out;
}

namespace {

using nn::LayerContext;

// The label of a module in the breakdown: Linear and RMSNorm by their role (q_proj, lm_head,
// input_layernorm, q_norm, ...), the other layers by their interface.
std::string label_of(const std::string& path, const nn::Module& module) {
  const std::string last = path.substr(path.rfind('.') + 1);
  if (module.layer_interface() == "Linear" || module.layer_interface() == "RMSNorm") return last;
  return module.layer_interface();
}

#define HK_TIMED(phase) LayerTimer::Scope hk_scope_(*timer, label + " " phase)

class TimedLinear final : public nn::LinearImpl {
 public:
  TimedLinear(std::shared_ptr<nn::LinearImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::Linear& l, const TensorView& x, const TensorView& y,
               Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, x, y, s);
  }
  void forward_train(const nn::Linear& l, const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, x, y, ctx, s);
  }
  void backward(const nn::Linear& l, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                const Tensor* dx, bool accumulate_dx, Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, x, ctx, dy, dx, accumulate_dx, s);
  }
  std::shared_ptr<nn::LinearImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedEmbedding final : public nn::EmbeddingImpl {
 public:
  TimedEmbedding(std::shared_ptr<nn::EmbeddingImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::Embedding& l, const TensorView& ids, const TensorView& out,
               Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, ids, out, s);
  }
  void forward_train(const nn::Embedding& l, const Tensor& ids, const Tensor& out,
                     LayerContext& ctx, Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, ids, out, ctx, s);
  }
  void backward(const nn::Embedding& l, const Tensor& ids, LayerContext& ctx, const Tensor& dout,
                Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, ids, ctx, dout, s);
  }
  std::shared_ptr<nn::EmbeddingImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedRMSNorm final : public nn::RMSNormImpl {
 public:
  TimedRMSNorm(std::shared_ptr<nn::RMSNormImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::RMSNorm& l, const TensorView& x, const TensorView& y,
               Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, x, y, s);
  }
  void forward_train(const nn::RMSNorm& l, const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, x, y, ctx, s);
  }
  void backward(const nn::RMSNorm& l, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, x, ctx, dy, dx, s);
  }
  std::shared_ptr<nn::RMSNormImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedRotary final : public nn::RotaryApplyImpl {
 public:
  TimedRotary(std::shared_ptr<nn::RotaryApplyImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::RotaryApply& l, const TensorView& q, const TensorView& k,
               const TensorView& cos, const TensorView& sin, Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, q, k, cos, sin, s);
  }
  void forward_train(const nn::RotaryApply& l, const Tensor& q, const Tensor& k, const Tensor& cos,
                     const Tensor& sin, LayerContext& ctx, Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, q, k, cos, sin, ctx, s);
  }
  void backward(const nn::RotaryApply& l, const Tensor& cos, const Tensor& sin, LayerContext& ctx,
                const Tensor& dq, const Tensor& dk, Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, cos, sin, ctx, dq, dk, s);
  }
  std::shared_ptr<nn::RotaryApplyImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedAttention final : public nn::AttentionImpl {
 public:
  TimedAttention(std::shared_ptr<nn::AttentionImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::Attention& l, const TensorView& q, const TensorView& k,
               const TensorView& v, const TensorView& out, const nn::AttentionCall& call,
               Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, q, k, v, out, call, s);
  }
  void forward_train(const nn::Attention& l, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& out, const nn::AttentionCall& call, LayerContext& ctx,
                     Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, q, k, v, out, call, ctx, s);
  }
  void backward(const nn::Attention& l, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const nn::AttentionCall& call, LayerContext& ctx,
                const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, q, k, v, out, call, ctx, dout, dq, dk, dv, s);
  }
  std::shared_ptr<nn::AttentionImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedActivation final : public nn::ActivationImpl {
 public:
  TimedActivation(std::shared_ptr<nn::ActivationImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::Activation& l, const TensorView& x, const TensorView& y,
               Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, x, y, s);
  }
  void forward_mul(const nn::Activation& l, const TensorView& gate, const TensorView& up,
                   const TensorView& out, Stream s) const override {
    HK_TIMED("forward");
    inner->forward_mul(l, gate, up, out, s);
  }
  void backward(const nn::Activation& l, const Tensor& x, const Tensor& dy, const Tensor& dx,
                Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, x, dy, dx, s);
  }
  void backward_mul(const nn::Activation& l, const Tensor& gate, const Tensor& up,
                    const Tensor& dout, const Tensor& dgate, const Tensor& dup,
                    Stream s) const override {
    HK_TIMED("backward");
    inner->backward_mul(l, gate, up, dout, dgate, dup, s);
  }
  std::shared_ptr<nn::ActivationImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedMLP final : public nn::MLPImpl {
 public:
  TimedMLP(std::shared_ptr<nn::MLPImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  void forward(const nn::MLP& l, const TensorView& x, const TensorView& y,
               Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, x, y, s);
  }
  void forward_train(const nn::MLP& l, const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, x, y, ctx, s);
  }
  void backward(const nn::MLP& l, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, x, ctx, dy, dx, s);
  }
  std::shared_ptr<nn::MLPImpl> inner;
  LayerTimer* timer;
  std::string label;
};

class TimedLoss final : public nn::CausalLMLossImpl {
 public:
  TimedLoss(std::shared_ptr<nn::CausalLMLossImpl> inner, LayerTimer* timer, std::string label)
      : inner(std::move(inner)), timer(timer), label(std::move(label)) {}
  std::string name() const override { return inner->name(); }
  bool supports_training() const override { return inner->supports_training(); }
  bool fuses_lm_head() const override { return inner->fuses_lm_head(); }
  void forward(const nn::CausalLMLoss& l, const TensorView& logits, const TensorView& labels,
               const TensorView& loss, const nn::CausalLMLossOptions& o, Stream s) const override {
    HK_TIMED("forward");
    inner->forward(l, logits, labels, loss, o, s);
  }
  void forward_train(const nn::CausalLMLoss& l, const Tensor& logits, const Tensor& labels,
                     const Tensor& loss, const nn::CausalLMLossOptions& o, LayerContext& ctx,
                     Stream s) const override {
    HK_TIMED("forward");
    inner->forward_train(l, logits, labels, loss, o, ctx, s);
  }
  void backward(const nn::CausalLMLoss& l, const Tensor& logits, const Tensor& labels,
                const nn::CausalLMLossOptions& o, LayerContext& ctx, float dloss,
                const Tensor& dlogits, Stream s) const override {
    HK_TIMED("backward");
    inner->backward(l, logits, labels, o, ctx, dloss, dlogits, s);
  }
  void forward_train_fused(const nn::CausalLMLoss& l, const nn::Linear& lm_head,
                           const Tensor& hidden, const Tensor& labels, const Tensor& loss,
                           const nn::CausalLMLossOptions& o, LayerContext& ctx,
                           Stream s) const override {
    HK_TIMED("forward (fused lm_head)");
    inner->forward_train_fused(l, lm_head, hidden, labels, loss, o, ctx, s);
  }
  void backward_fused(const nn::CausalLMLoss& l, const nn::Linear& lm_head, const Tensor& hidden,
                      const Tensor& labels, const nn::CausalLMLossOptions& o, LayerContext& ctx,
                      float dloss, const Tensor& dhidden, Stream s) const override {
    HK_TIMED("backward (fused lm_head)");
    inner->backward_fused(l, lm_head, hidden, labels, o, ctx, dloss, dhidden, s);
  }
  std::shared_ptr<nn::CausalLMLossImpl> inner;
  LayerTimer* timer;
  std::string label;
};

#undef HK_TIMED

template <class Timed, class Impl>
std::shared_ptr<nn::LayerImpl> wrap(const std::shared_ptr<nn::LayerImpl>& impl, LayerTimer* timer,
                                    const std::string& label) {
  auto typed = std::dynamic_pointer_cast<Impl>(impl);
  return typed ? std::make_shared<Timed>(typed, timer, label) : nullptr;
}

}  // namespace

struct LayerTimer::Installed {
  nn::Module* module;
  std::shared_ptr<nn::LayerImpl> original;
};

void LayerTimer::install(nn::Module& root) {
  for (auto& [path, module] : root.named_modules()) {
    std::shared_ptr<nn::LayerImpl> impl = module->impl();
    if (!impl) continue;
    const std::string label = label_of(path, *module);
    std::shared_ptr<nn::LayerImpl> timed;
    if (!timed) timed = wrap<TimedLinear, nn::LinearImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedEmbedding, nn::EmbeddingImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedRMSNorm, nn::RMSNormImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedRotary, nn::RotaryApplyImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedAttention, nn::AttentionImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedActivation, nn::ActivationImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedMLP, nn::MLPImpl>(impl, this, label);
    if (!timed) timed = wrap<TimedLoss, nn::CausalLMLossImpl>(impl, this, label);
    if (!timed) continue;  // an interface this timer does not know: left as it is
    installed_.push_back(std::make_unique<Installed>(Installed{module, impl}));
    module->set_impl(timed);
  }
}

void LayerTimer::uninstall() {
  for (auto& i : installed_) i->module->set_impl(i->original);
  installed_.clear();
}

}  // namespace hk::bench
