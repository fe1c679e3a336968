// CPU embedding lookup and its backward (a scatter-add into the table). Ids outside [0, V) throw
// InvalidArgument naming the id and its position; nothing here is vectorised or threaded.
#include "hk/error.h"
#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

void check_id(const char* op, int64_t id, int64_t vocab, size_t position) {
  if (id < 0 || id >= vocab)
    throw InvalidArgument(std::string(op) + ": id " + std::to_string(id) + " at position " +
                          std::to_string(position) + " is outside the table [0, " +
                          std::to_string(vocab) + ")");
}

}  // namespace

void embedding(const TensorView& weight, const TensorView& ids, const TensorView& out, Stream) {
  const std::vector<int64_t> id = load_ints(ids);
  const int64_t vocab = weight.shape[0], hidden = weight.shape[1];
  for (size_t i = 0; i < id.size(); ++i) check_id("embedding", id[i], vocab, i);
  // Row copies between views of one dtype (no conversion): out's row for flat position i is out
  // selected at i's multi-index over ids' shape, whatever out's strides are.
  for (size_t i = 0; i < id.size(); ++i) {
    TensorView row = out;
    int64_t rest = static_cast<int64_t>(i);
    for (int d = ids.ndim - 1; d >= 0; --d) {
      row.byte_offset +=
          static_cast<uint64_t>((rest % ids.shape[d]) * out.strides[d]) * dtype_size(out.dtype);
      rest /= ids.shape[d];
    }
    row.ndim = 1;
    row.shape[0] = hidden;
    row.strides[0] = out.strides[out.ndim - 1];
    copy_view(row, weight.select(0, id[i]));
  }
}

void embedding_backward(const TensorView& dout, const TensorView& ids, const TensorView& dweight,
                        Stream) {
  const std::vector<int64_t> id = load_ints(ids);
  const int64_t vocab = dweight.shape[0], hidden = dweight.shape[1];
  for (size_t i = 0; i < id.size(); ++i) check_id("embedding_backward", id[i], vocab, i);
  const bool wide = dweight.dtype == DType::F64;
  if (wide) {
    std::vector<double> acc = load<double>(dweight);
    const std::vector<double> g = load<double>(dout);
    for (size_t i = 0; i < id.size(); ++i)
      for (int64_t h = 0; h < hidden; ++h) acc[id[i] * hidden + h] += g[i * hidden + h];
    store(dweight, acc);
  } else {
    std::vector<float> acc = load<float>(dweight);
    const std::vector<float> g = load<float>(dout);
    for (size_t i = 0; i < id.size(); ++i)
      for (int64_t h = 0; h < hidden; ++h) acc[id[i] * hidden + h] += g[i * hidden + h];
    store(dweight, acc);
  }
}

}  // namespace hk::ops::cpu
