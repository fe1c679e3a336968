// Instantiates the mma.sync family (forward, split-KV decode, backward, KV append) for f16, head dim 64.
#include "flash_attn/launch_sm80.cuh"

namespace hk_flash {
HK_FLASH_INSTANTIATE_SM80(__half, 64)
}  // namespace hk_flash
