// read_roofline.h — the bound on a decode attention call's time from its bytes alone (see
// read_roofline.cu): a read-only kernel over the same K/V buffers and an empty kernel, each as
// `calls` nodes of one replayed CUDA graph. Host interface only.
#pragma once

#include <cstddef>
#include <vector>

struct CUstream_st;

struct ReadRoofline {
  double read_us = 0;   // per call: K and V read once, nothing else
  double empty_us = 0;  // per call: an empty kernel
};

// k[i], v[i]: bytes_each bytes each (a multiple of 16), rotated through like the attention calls.
ReadRoofline read_roofline(const std::vector<const void*>& k, const std::vector<const void*>& v,
                           size_t bytes_each, int calls, CUstream_st* stream);
