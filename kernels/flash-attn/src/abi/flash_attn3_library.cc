// flash_attn3_library.cc — the entry table of kernels-community/flash-attn3 (cuda variant).
// The Hopper build: TMA/wgmma warp-specialised forward where it applies, mma.sync otherwise.
#include "abi/flash_glue.h"

FLASH_ATTN_ENTRIES(true)
