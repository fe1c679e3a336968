// activation_cuda_library.cc — kernels-community/activation, cuda variant (capture-safe).
#define ACT_NS cuda
#define ACT_DEVICE "cuda"
#define ACT_MODES (HK_MODE_INFERENCE | HK_MODE_TRAINING | HK_MODE_CAPTURE)
#include "activation_table.inc"
