// ZeRO stage 1 (zero_optimizer.h): this rank's pieces of the buckets, AdamW over them, the global
// gradient norm, and the gathers of parameters and of the state for checkpoints.
#include "train/distributed/zero_optimizer.h"

#include <cmath>
#include <map>

#include "hk/error.h"
#include "ops/cpu_util.h"
#ifdef HK_HAVE_CUDA
#include "train/distributed/zero_cuda.h"
#endif

namespace hk::dist {
namespace {

const char* const kMoments[] = {"exp_avg", "exp_avg_sq"};

}  // namespace

ZeroOptimizer::ZeroOptimizer(GradientReducer& reducer, optim::AdamWOptions options, Stream stream)
    : reducer_(reducer), options_(options) {
  HK_CHECK(reducer.zero_stage() == 1, "ZeroOptimizer needs a reducer planned for ZeRO stage 1");
  const int world = reducer.group().size(), rank = reducer.group().rank();
  const auto& buckets = reducer.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const Bucket& b = buckets[bi];
    const int64_t shard = b.numel / world, lo = shard * rank, hi = lo + shard;
    for (size_t ei = 0; ei < b.entries.size(); ++ei) {
      const BucketEntry& e = b.entries[ei];
      const int64_t begin = std::max(e.offset, lo), end = std::min(e.offset + e.numel, hi);
      if (begin >= end) continue;
      pieces_.push_back({bi, ei, begin, end - begin});
    }
  }
  std::vector<optim::OptimTensor> slots;
  for (const Piece& p : pieces_) {
    const optim::OptimTensor& t = reducer.tensors()[buckets[p.bucket].entries[p.entry].tensor];
    values_.push_back(std::make_unique<Tensor>());
    grads_.push_back(std::make_unique<Tensor>());
    slots.push_back({t.name, values_.back().get(), grads_.back().get(), t.weight_decay});
  }
  point_pieces(/*into_buckets=*/false);  // the current values: masters are copied from them
  if (!slots.empty()) adamw_ = std::make_unique<optim::AdamW>(std::move(slots), options, stream);
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::point_pieces(bool into_buckets) {
  const auto& buckets = reducer_.buckets();
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const Bucket& b = buckets[p.bucket];
    const BucketEntry& e = b.entries[p.entry];
    if (into_buckets) {
      *values_[i] = b.values.slice(0, p.begin, p.begin + p.numel);
      *grads_[i] = b.grads.slice(0, p.begin, p.begin + p.numel);
    } else {
      const Tensor& value = *reducer_.tensors()[e.tensor].value;
      *values_[i] =
          value.reshape({value.numel()}).slice(0, p.begin - e.offset, p.begin - e.offset + p.numel);
    }
  }
}

void ZeroOptimizer::attach(Stream) {
  point_pieces(/*into_buckets=*/true);
}

int64_t ZeroOptimizer::steps() const {
  return adamw_ ? adamw_->steps() : steps_without_pieces_;
}

optim::GradNorm ZeroOptimizer::clip_grad_norm(double max_norm, Stream stream) {
  HK_CHECK(std::isfinite(max_norm), "clip_grad_norm: max_norm must be finite");
  ProcessGroup& group = reducer_.group();
  const Device device = group.device();
  if (!norm_.norm.defined()) {
    norm_.norm = Tensor::zeros({1}, DType::F32, device, stream);
    norm_.clip_coef = Tensor::zeros({1}, DType::F32, device, stream);
  }
  if (device.is_cpu()) {
    // Σg² in double over this rank's pieces, summed over the ranks in double: the same sum as
    // stage 0's, in another order.
    if (!sum_of_squares_.defined()) sum_of_squares_ = Tensor::zeros({1}, DType::F64, device);
    double sum = 0;
    for (const auto& g : grads_) {
      const char* p = static_cast<const char*>(g->view().ptr());
      const size_t es = dtype_size(g->dtype());
      for (int64_t i = 0; i < g->numel(); ++i) {
        const double v = ops::cpu::load_one<double>(p + i * es, g->dtype());
        sum += v * v;
      }
    }
    sum_of_squares_.data_as<double>()[0] = sum;
    group.all_reduce(sum_of_squares_, ReduceOp::Sum, stream);
    const float norm = static_cast<float>(std::sqrt(sum_of_squares_.data_as<double>()[0]));
    norm_.norm.data_as<float>()[0] = norm;
    norm_.clip_coef.data_as<float>()[0] =
        max_norm > 0 ? std::fmin(1.0f, static_cast<float>(max_norm) / (norm + 1e-6f)) : 1.0f;
    return norm_;
  }
#ifdef HK_HAVE_CUDA
  if (!sum_of_squares_.defined()) sum_of_squares_ = Tensor::zeros({1}, DType::F32, device, stream);
  if (adamw_) {
    const optim::GradNorm local = adamw_->clip_grad_norm(0.0, stream);
    cuda::square(local.norm.data_as<float>(), sum_of_squares_.data_as<float>(), stream);
  } else {
    cuda::square(nullptr, sum_of_squares_.data_as<float>(), stream);
  }
  group.all_reduce(sum_of_squares_, ReduceOp::Sum, stream);
  cuda::finish_norm(sum_of_squares_.data_as<float>(), max_norm, norm_.norm.data_as<float>(),
                    norm_.clip_coef.data_as<float>(), stream);
#endif
  return norm_;
}

void ZeroOptimizer::gather_parameters(Stream stream) {
  ProcessGroup& group = reducer_.group();
  for (Bucket& b : reducer_.buckets()) {
    const int64_t shard = b.numel / group.size(), first = shard * group.rank();
    group.all_gather(b.values.slice(0, first, first + shard), b.values, stream);
  }
}

void ZeroOptimizer::step(double lr, const Tensor* grad_scale, Stream stream) {
  if (adamw_)
    adamw_->step(lr, grad_scale, stream);
  else
    ++steps_without_pieces_;
  gather_parameters(stream);
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::full_state(Stream stream) {
  ProcessGroup& group = reducer_.group();
  std::map<std::string, Tensor> mine;
  if (adamw_)
    for (auto& [name, t] : adamw_->state()) mine[name] = t;
  std::vector<std::string> kinds(std::begin(kMoments), std::end(kMoments));
  if (options_.master_weights) kinds.push_back("master");
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t bi = 0; bi < reducer_.buckets().size(); ++bi) {
    const Bucket& b = reducer_.buckets()[bi];
    const int64_t shard = b.numel / group.size(), first = shard * group.rank();
    const DType state_dtype = options_.master_weights ? DType::F32 : b.value_dtype;
    for (const std::string& kind : kinds) {
      Tensor full = Tensor::zeros({b.numel}, state_dtype, group.device(), stream);
      for (const Piece& p : pieces_) {
        if (p.bucket != bi) continue;
        const std::string& name = reducer_.tensors()[b.entries[p.entry].tensor].name;
        full.slice(0, p.begin, p.begin + p.numel)
            .copy_from(mine.at(kind + "." + name).view(), stream);
      }
      group.all_gather(full.slice(0, first, first + shard), full, stream);
      for (const BucketEntry& e : b.entries) {
        const optim::OptimTensor& t = reducer_.tensors()[e.tensor];
        out.emplace_back(kind + "." + t.name,
                         full.slice(0, e.offset, e.offset + e.numel).reshape(t.value->sizes()));
      }
    }
  }
  return out;
}

void ZeroOptimizer::load_full_state(const std::vector<std::pair<std::string, Tensor>>& full,
                                    int64_t steps, Stream stream) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : full) by_name[name] = &t;
  if (!adamw_) {
    steps_without_pieces_ = steps;
    return;
  }
  std::vector<std::string> kinds(std::begin(kMoments), std::end(kMoments));
  if (options_.master_weights) kinds.push_back("master");
  std::vector<std::pair<std::string, Tensor>> pieces;
  for (const Piece& p : pieces_) {
    const Bucket& b = reducer_.buckets()[p.bucket];
    const BucketEntry& e = b.entries[p.entry];
    const std::string& name = reducer_.tensors()[e.tensor].name;
    for (const std::string& kind : kinds) {
      auto it = by_name.find(kind + "." + name);
      if (it == by_name.end())
        throw InvalidArgument("optimizer state has no tensor '" + kind + "." + name +
                              "'; it was saved for a different model or optimizer setting");
      const Tensor& t = *it->second;
      HK_CHECK(t.numel() == e.numel && t.is_contiguous(),
               "optimizer state tensor '" + kind + "." + name + "' is " + t.view().str() +
                   ", the model needs " + std::to_string(e.numel) + " elements");
      pieces.emplace_back(
          kind + "." + name,
          t.reshape({t.numel()}).slice(0, p.begin - e.offset, p.begin - e.offset + p.numel));
    }
  }
  adamw_->load_state(pieces, steps, stream);
}

void ZeroOptimizer::refresh_model_from_master(Stream stream) {
  if (adamw_) adamw_->refresh_model_from_master(stream);
  gather_parameters(stream);
}

}  // namespace hk::dist
