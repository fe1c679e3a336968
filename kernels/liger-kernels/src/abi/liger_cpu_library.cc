// abi/liger_cpu_library.cc — kernels-community/liger-kernels, cpu variant (table only; the code
// is liger_core_cpu).
#define LIGER_TABLE_NS cpu
#define LIGER_TABLE_DEVICE "cpu"
#define LIGER_TABLE_CAPTURE false
#include "abi/liger_table.inc"
