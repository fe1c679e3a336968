// Instantiates the mma.sync family (forward, split-KV decode, backward, KV append) for bf16, head dim 256.
#include "flash_attn/launch_sm80.cuh"

namespace hk_flash {
HK_FLASH_INSTANTIATE_SM80(__nv_bfloat16, 256)
}  // namespace hk_flash
