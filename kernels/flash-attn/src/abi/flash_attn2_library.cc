// flash_attn2_library.cc — the entry table of kernels-community/flash-attn2 (cuda variant).
// The FA2 algorithm: the mma.sync kernels of kernels/flash-attn (the Hopper forward stays off).
#include "abi/flash_glue.h"

FLASH_ATTN_ENTRIES(false)
