// owner/fused-rmsnorm-mlp, cuda variant (table only; the code is liger_core_cuda).
#define RMSNORM_MLP_NS cuda
#define RMSNORM_MLP_DEVICE "cuda"
#include "rmsnorm_mlp_table.inc"
