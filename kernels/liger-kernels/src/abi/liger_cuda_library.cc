// abi/liger_cuda_library.cc — kernels-community/liger-kernels, cuda variant (table only; the code
// is liger_core_cuda).
#define LIGER_TABLE_NS cuda
#define LIGER_TABLE_DEVICE "cuda"
#define LIGER_TABLE_CAPTURE true
#include "abi/liger_table.inc"
