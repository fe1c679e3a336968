// flash_attn4_library.cc — the entry table of kernels-community/flash-attn4 (cuda variant).
// hk has no Blackwell (FA4) kernels: on Hopper this repo is the flash-attn3 code, and says so
// in its metadata (provenance.description).
#include "abi/flash_glue.h"

FLASH_ATTN_ENTRIES(true)
