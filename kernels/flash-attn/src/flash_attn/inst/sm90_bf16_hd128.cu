// Instantiates the Hopper forward and backward for bf16, head dim 128.
#include "flash_attn/launch_sm90.cuh"

namespace hk_flash {
HK_FLASH_INSTANTIATE_SM90(__nv_bfloat16, 128)
}  // namespace hk_flash
