// Internal: the CUDA side of hk::optim (src/train/optim/*_cuda.cu), called by adamw.cc and
// grad_norm.cc for CUDA tensors. Plain C++ types only, so the .cc files need no CUDA headers.
//
// A TensorTable describes every tensor of one multi-tensor launch (addresses, sizes, dtypes);
// each tensor is cut into fixed chunks and one CUDA block handles one chunk, finding its tensor by
// binary search over the chunk prefix. The table lives on the device and is re-uploaded only when
// it changes (parameters and gradient buffers are stable between steps). Tensors are grouped by
// their dtype combination (one group in practice: a bf16 model, an f32 model, or f32 masters over
// a bf16 model) so each group's launch is compiled for its dtypes: no per-element dtype switch,
// 16-byte vector accesses. A step is one launch per group.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "hk/device.h"
#include "hk/dtype.h"
#include "hk/stream.h"
#include "train/optim/adamw_math.h"

namespace hk::optim::cuda {

// One tensor of a multi-tensor launch. Unused pointers are null.
struct TensorSlot {
  void* param = nullptr;       // the tensor AdamW updates (the master when there is one)
  const void* grad = nullptr;  // its gradient (any floating dtype)
  void* exp_avg = nullptr;     // first moment
  void* exp_avg_sq = nullptr;  // second moment
  void* model_copy = nullptr;  // master weights: the model's 16-bit tensor, rewritten from param
  int64_t numel = 0;
  int64_t chunk_begin = 0;  // filled by TensorTable
  DType param_dtype = DType::F32;
  DType grad_dtype = DType::F32;
  DType state_dtype = DType::F32;
  DType model_dtype = DType::F32;
  uint8_t decay = 0;
  uint8_t vector_ok = 0;  // filled by TensorTable: every pointer 16-byte aligned
  uint8_t kind = 0;       // filled by TensorTable: the dtype combination (its group)
  uint8_t pad_ = 0;
  bool operator==(const TensorSlot& o) const;
};

// A run of slots of one dtype combination, and the chunks they cover.
struct SlotGroup {
  int first_slot = 0, num_slots = 0;
  int64_t first_chunk = 0, num_chunks = 0;
  uint8_t kind = 0;
};

// Elements per chunk (one CUDA block).
inline constexpr int64_t kChunkElements = 16384;

class TensorTable {
 public:
  explicit TensorTable(Device device);
  ~TensorTable();
  // Groups `slots` by dtype combination (stable within a group) and uploads them (enqueued on
  // `stream`) unless they equal the last upload.
  void update(std::vector<TensorSlot> slots, Stream stream);
  int64_t num_chunks() const { return num_chunks_; }
  const std::vector<SlotGroup>& groups() const { return groups_; }
  int64_t num_tensors() const { return static_cast<int64_t>(host_.size()); }
  const TensorSlot* device_slots() const { return device_; }
  Device device() const { return device_id_; }

 private:
  Device device_id_;
  std::vector<TensorSlot> host_;
  std::vector<SlotGroup> groups_;
  TensorSlot* device_ = nullptr;
  size_t capacity_ = 0;
  int64_t num_chunks_ = 0;
};

// One fused AdamW step over the table. grad_scale: device f32 scalar or null.
void adamw_step(const TensorTable& table, const detail::AdamWScalars& scalars,
                const float* grad_scale, Stream stream);
// model_copy ← round(param) for every slot that has a model_copy.
void copy_master_to_model(const TensorTable& table, Stream stream);

// Σ g² over the table's `grad` tensors into partials[num_chunks] (f32), then norm[0] = √Σ and
// coef[0] = min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0). partials has num_chunks
// elements (device memory owned by the caller).
void grad_norm(const TensorTable& table, float* partials, double max_norm, float* norm, float* coef,
               Stream stream);

}  // namespace hk::optim::cuda
