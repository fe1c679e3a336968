// rotary_cuda_library.cc — kernels-community/rotary, cuda variant (no sync, no allocation:
// capture-safe).
#define ROTARY_NS cuda
#define ROTARY_DEVICE "cuda"
#define ROTARY_MODES (HK_MODE_INFERENCE | HK_MODE_TRAINING | HK_MODE_CAPTURE)
#include "rotary_table.inc"
