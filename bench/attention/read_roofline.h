// read_roofline.h — the bound on a decode attention call's time from its bytes alone (see
// read_roofline.cu): launchers of a read-only kernel over the same K/V buffers and of an empty
// kernel, which hk_bench_attention captures and times like the attention calls. Host interface
// only.
#pragma once

#include <cstddef>

struct CUstream_st;

// Reads k and v (bytes_each each, a multiple of 16) once; `sink` is one device word the kernel
// writes only for a value the benchmark's inputs never give (it keeps the loads live).
void launch_read_kv(const void* k, const void* v, size_t bytes_each, unsigned* sink,
                    CUstream_st* stream);
void launch_empty(CUstream_st* stream);
