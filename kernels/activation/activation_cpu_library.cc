// activation_cpu_library.cc — kernels-community/activation, cpu variant.
#define ACT_NS cpu
#define ACT_DEVICE "cpu"
#define ACT_MODES (HK_MODE_INFERENCE | HK_MODE_TRAINING)
#include "activation_table.inc"
