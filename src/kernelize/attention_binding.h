// Internal: hub attention kernels as attention functions (hk/attention_functions.h).
//
// kernelize binds `attn_implementation` hub ids and flash_attention_N to an attention@1 entry,
// plus the attention_varlen@1 entry of the same library when it has one (packed sequences:
// AttentionCall::cu_seqlens_q). The inference form calls the entry's forward; the training form
// saves the kernel's f32 lse and runs the entry's backward. A call the kernel refuses as
// unsupported (a head dim it has no code for, ...) runs the built-in "sdpa" instead, with one
// note on stderr per kernel. Workspace the entries ask for comes from the caching allocator on
// the call's stream. Not here: resolution and loading (kernelize.cc).
#pragma once

#include "hk/attention_functions.h"
#include "hk/kernel_loader.h"

namespace hk::kernel_binding {

struct AttentionKernels {
  KernelFunction attention;  // attention@1 (required)
  KernelFunction varlen;     // attention_varlen@1, or invalid when the library has none
};

nn::AttentionFunction make_attention_function(AttentionKernels kernels);
// Requires kernels.attention to have a backward.
nn::AttentionTraining make_attention_training(AttentionKernels kernels);

}  // namespace hk::kernel_binding
