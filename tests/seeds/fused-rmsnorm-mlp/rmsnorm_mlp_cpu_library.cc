// owner/fused-rmsnorm-mlp, cpu variant (table only; the code is liger_core_cpu).
#define RMSNORM_MLP_NS cpu
#define RMSNORM_MLP_DEVICE "cpu"
#include "rmsnorm_mlp_table.inc"
