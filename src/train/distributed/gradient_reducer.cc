// The data-parallel gradient buckets (gradient_reducer.h).
#include "train/distributed/gradient_reducer.h"

#include <algorithm>

#include "hk/error.h"
#include "hk/ops.h"

namespace hk::dist {
namespace {

// Every tensor starts on a 64-byte boundary, so the fused AdamW kernel's 16-byte vector path
// holds for each of them (and for ZeRO chunks, which are multiples of it).
int64_t alignment_elements(DType d) {
  return static_cast<int64_t>(64 / dtype_size(d));
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

}  // namespace

GradientReducer::GradientReducer(std::shared_ptr<ProcessGroup> group,
                                 std::vector<optim::OptimTensor> tensors,
                                 std::vector<DType> grad_dtypes, std::vector<DType> value_dtypes,
                                 ReducerOptions options)
    : group_(std::move(group)), tensors_(std::move(tensors)), options_(options) {
  HK_CHECK(options_.zero_stage == 0 || options_.zero_stage == 1,
           "--zero-stage must be 0 or 1, got " + std::to_string(options_.zero_stage));
  HK_CHECK(grad_dtypes.size() == tensors_.size() && value_dtypes.size() == tensors_.size(),
           "GradientReducer: one gradient and one value dtype per tensor");
  const int world = group_->size();
  // Reverse parameter order (backward reaches the last layers first); one open bucket per dtype
  // pair; the first bucket of each pair is small so that communication starts early.
  std::map<std::pair<DType, DType>, size_t> open;
  std::map<std::pair<DType, DType>, int> closed_count;
  for (size_t k = tensors_.size(); k-- > 0;) {
    const auto key = std::make_pair(grad_dtypes[k], value_dtypes[k]);
    const int64_t numel = tensors_[k].value->numel();
    auto it = open.find(key);
    if (it != open.end()) {
      Bucket& b = buckets_[it->second];
      const size_t cap =
          closed_count[key] == 0 ? options_.first_bucket_bytes : options_.bucket_bytes;
      const size_t bytes = static_cast<size_t>(b.numel + numel) * dtype_size(key.first);
      if (bytes > cap) {
        ++closed_count[key];
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      Bucket b;
      b.grad_dtype = key.first;
      b.value_dtype = key.second;
      buckets_.push_back(std::move(b));
      it = open.emplace(key, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    const int64_t align =
        std::max(alignment_elements(b.grad_dtype), alignment_elements(b.value_dtype));
    BucketEntry e;
    e.tensor = k;
    e.offset = round_up(b.numel, align);
    e.numel = numel;
    b.numel = e.offset + numel;
    b.entries.push_back(e);
  }
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    const int64_t align =
        std::max(alignment_elements(b.grad_dtype), alignment_elements(b.value_dtype));
    b.numel = round_up(std::max<int64_t>(b.numel, 1), align * world);
    for (size_t ei = 0; ei < b.entries.size(); ++ei)
      where_[tensors_[b.entries[ei].tensor].value] = {bi, ei};
  }
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::attach(nn::Module& root, Stream compute) {
  compute_ = compute;
  const Device device = group_->device();
  if (device.is_cuda()) {
    comm_ = std::make_unique<OwnedStream>(device);
    comm_done_ = std::make_shared<Event>();
  }
  for (Bucket& b : buckets_) {
    b.grads = Tensor::zeros({b.numel}, b.grad_dtype, device, compute);
    if (device.is_cuda()) b.ready = std::make_shared<Event>();
    for (const BucketEntry& e : b.entries) {
      const optim::OptimTensor& t = tensors_[e.tensor];
      *t.grad = b.grads.slice(0, e.offset, e.offset + e.numel).reshape(t.value->sizes());
    }
  }
  // Every gradient is marked stale, so the first backward writes its bucket view.
  for (auto& [path, p] : root.named_parameters("", /*include_buffers=*/false))
    if (p->grad.defined() && p->tied_to.empty()) p->grad_overwrite = true;
  if (options_.zero_stage == 1) {
    for (Bucket& b : buckets_) b.values = Tensor::zeros({b.numel}, b.value_dtype, device, compute);
    rehome_values(root, compute);
  }
}

void GradientReducer::rehome_values(nn::Module& root, Stream compute) {
  if (options_.zero_stage != 1) return;
  bool moved = false;
  for (Bucket& b : buckets_) {
    for (const BucketEntry& e : b.entries) {
      const optim::OptimTensor& t = tensors_[e.tensor];
      Tensor view = b.values.slice(0, e.offset, e.offset + e.numel).reshape(t.value->sizes());
      if (t.value->view().ptr() == view.view().ptr()) continue;
      HK_CHECK(t.value->dtype() == b.value_dtype && t.value->numel() == e.numel,
               "ZeRO: parameter '" + t.name + "' is " + t.value->view().str() +
                   ", its bucket expects " + std::to_string(e.numel) + " " +
                   dtype_name(b.value_dtype) + " elements");
      view.copy_from(t.value->view(), compute);
      *t.value = view;
      moved = true;
    }
  }
  if (moved) nn::resolve_ties(root);
}

Stream GradientReducer::comm_stream(Stream compute) const {
  return comm_ ? comm_->get() : compute;
}

void GradientReducer::launch(Bucket& b, Stream compute) {
  const Stream comm = comm_stream(compute);
  if (b.ready) {
    b.ready->record(compute);
    b.ready->wait(comm);
  }
  if (options_.zero_stage == 1) {
    const int64_t shard = b.numel / group_->size();
    const int64_t first = shard * group_->rank();
    group_->reduce_scatter(b.grads, b.grads.slice(0, first, first + shard), ReduceOp::Sum, comm);
  } else {
    group_->all_reduce(b.grads, ReduceOp::Sum, comm);
  }
  b.launched = true;
}

void GradientReducer::launch_ready_buckets(Stream compute) {
  // In bucket order on every rank, whatever order the gradients came in.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(buckets_[next_bucket_], compute);
    ++next_bucket_;
  }
}

Loss::GradientsReadyFn GradientReducer::on_gradients_ready() {
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.entries.size());
    b.launched = false;
  }
  next_bucket_ = 0;
  return [this](const std::vector<nn::Parameter*>& ready) {
    for (nn::Parameter* p : ready) {
      auto it = where_.find(&p->value);
      if (it == where_.end()) continue;  // not trainable here (frozen)
      Bucket& b = buckets_[it->second.first];
      --b.pending;
    }
    launch_ready_buckets(compute_);
  };
}

void GradientReducer::finish(Stream compute) {
  for (size_t i = next_bucket_; i < buckets_.size(); ++i) {
    if (!buckets_[i].launched) launch(buckets_[i], compute);
  }
  next_bucket_ = buckets_.size();
  if (comm_) {
    comm_done_->record(comm_->get());
    comm_done_->wait(compute);
  }
}

}  // namespace hk::dist
