// Instantiates the Hopper forward and backward for f16, head dim 128.
#include "flash_attn/launch_sm90.cuh"

namespace hk_flash {
HK_FLASH_INSTANTIATE_SM90(__half, 128)
}  // namespace hk_flash
