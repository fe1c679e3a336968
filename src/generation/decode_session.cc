// The device decode session of generate() (decode_session.h): buffers, graph capture and replay,
// pinned host slots for the per-step token copy.
#include "decode_session.h"

#include <algorithm>

#include "../models/decoder_lm.h"
#include "hk/error.h"
#ifdef HK_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace hk {

#ifndef HK_HAVE_CUDA

std::unique_ptr<DecodeSession> DecodeSession::create(const DecoderLM&, int64_t, int64_t, bool, bool,
                                                     std::string& why) {
  why = "hk was built without CUDA";
  return nullptr;
}
DecodeSession::~DecodeSession() = default;
bool DecodeSession::serves(const DecoderLM&, int64_t, int64_t, bool, bool) const {
  return false;
}
void DecodeSession::start(const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t,
                          const std::vector<int64_t>&, const std::vector<int64_t>&,
                          const std::vector<int64_t>&, int64_t) {}
void DecodeSession::launch_step(int) {}
const int64_t* DecodeSession::tokens(int) {
  return nullptr;
}
const float* DecodeSession::sample_step(const std::vector<int64_t>&) {
  return nullptr;
}
void DecodeSession::mark_done(int64_t) {}
void DecodeSession::run_step() {}
void DecodeSession::drop_graph() {}

#else

namespace {
cudaStream_t native(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

Tensor device_ints(const std::vector<int64_t>& v, DType dtype, Device device, Stream stream) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}, dtype).to(device, stream);
}
}  // namespace

std::unique_ptr<DecodeSession> DecodeSession::create(const DecoderLM& lm, int64_t batch,
                                                     int64_t capacity, bool greedy, bool graphs,
                                                     std::string& why) {
  if (!lm.device.is_cuda()) {
    why = "the model is on " + lm.device.str();
    return nullptr;
  }
  const ModelConfig& c = lm.config;
  auto s = std::unique_ptr<DecodeSession>(new DecodeSession());
  // Blocks reused below may come from the default stream's cache: let earlier work finish.
  synchronize_device(lm.device);
  s->stream_ = OwnedStream(lm.device);
  s->lm_ = &lm;
  s->batch_ = batch;
  s->capacity_ = capacity;
  s->vocab_ = c.vocab_size;
  s->greedy_ = greedy;
  s->graphs_ = graphs;
  s->cache_ = std::make_unique<KVCache>(c.num_hidden_layers, batch, capacity, c.num_key_value_heads,
                                        c.head_dim, lm.dtype, lm.device);
  const Device dev = lm.device;
  DecodeBuffers& st = s->state_;
  st.tokens = Tensor::zeros({batch}, DType::I64, dev);
  st.positions = Tensor::zeros({batch}, DType::I32, dev);
  st.lengths = Tensor::zeros({batch}, DType::I32, dev);
  st.key_start = Tensor::zeros({batch}, DType::I32, dev);
  st.done = Tensor::zeros({batch}, DType::I32, dev);
  st.eos = Tensor::zeros({8}, DType::I64, dev);  // grown (before a capture) when more are given
  s->step_ = DecodeStep::plan(lm, *s->cache_, st, greedy, why);
  if (!s->step_) return nullptr;
  if (graphs && !s->step_->capture_refusal().empty())
    s->graph_note_ = "not captured: " + s->step_->capture_refusal();
  HK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s->host_tokens_),
                               sizeof(int64_t) * 2 * size_t(batch)));
  HK_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&s->host_input_), sizeof(int64_t) * size_t(batch)));
  HK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s->host_one_), sizeof(int32_t)));
  *s->host_one_ = 1;
  if (!greedy)
    HK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s->host_logits_),
                                 sizeof(float) * size_t(batch) * size_t(s->vocab_)));
  for (void*& e : s->events_) {
    cudaEvent_t ev;
    HK_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e = ev;
  }
  synchronize_device(dev);
  return s;
}

DecodeSession::~DecodeSession() {
  if (stream_.get().handle) cudaStreamSynchronize(native(stream_.get()));
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  for (void* e : events_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (host_tokens_) cudaFreeHost(host_tokens_);
  if (host_input_) cudaFreeHost(host_input_);
  if (host_one_) cudaFreeHost(host_one_);
  if (host_logits_) cudaFreeHost(host_logits_);
  pool_.reset();  // before the stream goes (members are destroyed after this body)
}

bool DecodeSession::serves(const DecoderLM& lm, int64_t batch, int64_t capacity, bool greedy,
                           bool graphs) const {
  return lm_ == &lm && batch_ == batch && capacity_ == capacity && greedy_ == greedy &&
         graphs_ == graphs && step_ && step_->matches(lm);
}

void DecodeSession::start(const std::vector<int64_t>& first_tokens,
                          const std::vector<int64_t>& positions, int64_t length,
                          const std::vector<int64_t>& key_start, const std::vector<int64_t>& done,
                          const std::vector<int64_t>& eos, int64_t pad_id) {
  const Device dev = lm_->device;
  const Stream s = stream();
  state_.tokens.copy_from(Tensor::from_ints(first_tokens, {batch_}, DType::I64), s);
  state_.positions.copy_from(Tensor::from_ints(positions, {batch_}, DType::I32), s);
  state_.lengths.copy_from(
      Tensor::from_ints(std::vector<int64_t>(size_t(batch_), length), {batch_}, DType::I32), s);
  state_.key_start.copy_from(Tensor::from_ints(key_start, {batch_}, DType::I32), s);
  state_.done.copy_from(Tensor::from_ints(done, {batch_}, DType::I32), s);
  // The eos buffer's address, the eos count and the pad id are in the captured graph: a new
  // generation that changes them drops the graph (the next step captures again, reusing the pool).
  const int64_t n = static_cast<int64_t>(eos.size());
  if (exec_ && (n > state_.eos.size(0) || n != state_.num_eos || pad_id != state_.pad_id))
    drop_graph();
  if (n > state_.eos.size(0))
    state_.eos = device_ints(eos, DType::I64, dev, s);
  else if (n > 0)
    state_.eos.slice(0, 0, n).copy_from(Tensor::from_ints(eos, {n}, DType::I64), s);
  state_.num_eos = static_cast<int>(n);
  state_.pad_id = pad_id;
  synchronize(dev, s);
}

void DecodeSession::drop_graph() {
  synchronize(lm_->device, stream());
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
  tried_capture_ = false;
}

void DecodeSession::run_step() {
  const Stream s = stream();
  if (exec_) {
    HK_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), native(s)));
    return;
  }
  const bool capture = graphs_ && !tried_capture_ && step_->capture_refusal().empty();
  if (!capture) {
    step_->enqueue(s);
    return;
  }
  tried_capture_ = true;
  // This step runs eagerly inside the pool (sizing it), then the same launches are captured.
  if (!pool_) pool_ = std::make_unique<GraphPool>(lm_->device);
  {
    GraphPoolScope scope(*pool_, /*allow_device_malloc=*/true);
    step_->enqueue(s);
  }
  cudaGraph_t graph = nullptr;
  std::string failure;
  HK_CUDA_CHECK(cudaStreamBeginCapture(native(s), cudaStreamCaptureModeThreadLocal));
  try {
    GraphPoolScope scope(*pool_, /*allow_device_malloc=*/false);
    step_->enqueue(s);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(native(s), &graph);
  if (failure.empty() && end != cudaSuccess)
    failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
  cudaGraphExec_t exec = nullptr;
  if (failure.empty()) {
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    if (inst != cudaSuccess) {
      failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
      exec = nullptr;
    }
  }
  if (!failure.empty()) {
    cudaGetLastError();  // clear the capture's error state
    if (graph) cudaGraphDestroy(graph);
    graph_note_ = "capture failed, decoding without a graph: " + failure;
    return;
  }
  graph_ = graph;
  exec_ = exec;
}

void DecodeSession::launch_step(int slot) {
  run_step();
  const Stream s = stream();
  HK_CUDA_CHECK(cudaMemcpyAsync(host_tokens_ + slot * batch_, state_.tokens.view().ptr(),
                                sizeof(int64_t) * size_t(batch_), cudaMemcpyDeviceToHost,
                                native(s)));
  HK_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), native(s)));
}

const int64_t* DecodeSession::tokens(int slot) {
  HK_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[slot])));
  return host_tokens_ + slot * batch_;
}

const float* DecodeSession::sample_step(const std::vector<int64_t>& tokens) {
  const Stream s = stream();
  std::copy(tokens.begin(), tokens.end(), host_input_);
  HK_CUDA_CHECK(cudaMemcpyAsync(state_.tokens.view().ptr(), host_input_,
                                sizeof(int64_t) * size_t(batch_), cudaMemcpyHostToDevice,
                                native(s)));
  run_step();
  HK_CUDA_CHECK(cudaMemcpyAsync(host_logits_, step_->logits_f32().view().ptr(),
                                sizeof(float) * size_t(batch_) * size_t(vocab_),
                                cudaMemcpyDeviceToHost, native(s)));
  HK_CUDA_CHECK(cudaStreamSynchronize(native(s)));
  return host_logits_;
}

void DecodeSession::mark_done(int64_t row) {
  HK_CUDA_CHECK(cudaMemcpyAsync(state_.done.data_as<int32_t>() + row, host_one_, sizeof(int32_t),
                                cudaMemcpyHostToDevice, native(stream())));
}

#endif  // HK_HAVE_CUDA

}  // namespace hk
