// flash_attn/block_schedule.h — the host's model of how the GPU runs a Hopper kernel's blocks in
// block_order (device_common.cuh): each block starts, in launch order, on the SM that frees first.
// api.cu uses it to choose the backward's kv-head sections; tests check the choice without a GPU.
// Not here: anything that touches CUDA, or the forward's sections (forward_heads_per_section
// sizes those by L2 alone: its sections hold many waves of blocks at every shape measured).
#pragma once

#include <vector>

namespace hk_flash {

// The backward's work per key block (128 keys): the 64-query tiles of its GQA group that see
// those keys (causal aligned bottom-right, windows ignored), plus one for the block's start.
std::vector<double> backward_block_work(int seqlen_q, int seqlen_k, int group, bool causal);

// The last block's end over an SM's mean work (1: no tail) when `heads` heads of blocks with
// `work` per position run in block_order with `section` heads a section on `sms` SMs.
double schedule_tail(const std::vector<double>& work, int heads, int section, int sms);

// The largest section of at most `fit` heads whose schedule ends within 2 % of the one-section
// order's (every head in one section: position-major, longest-first across all heads), else
// `heads` (one section).
int choose_section(const std::vector<double>& work, int heads, int fit, int sms);

}  // namespace hk_flash
