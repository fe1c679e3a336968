// One CUDA-graph round for the capture tests: `step` recorded on `stream` into a graph,
// instantiated, launched `replays` times and waited for, every CUDA call an assertion (call it
// under ASSERT_NO_FATAL_FAILURE). What a test checks around it — poisoned outputs, allocation
// counts, the replayed values against the eager ones — stays in the test.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>

namespace hk::testing {

inline void capture_and_replay(cudaStream_t stream, const std::function<void()>& step,
                               int replays = 1, const char* capture_failure = "") {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  step();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << capture_failure;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < replays; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace hk::testing
