// rotary_cpu_library.cc — kernels-community/rotary, cpu variant.
#define ROTARY_NS cpu
#define ROTARY_DEVICE "cpu"
#define ROTARY_MODES (HK_MODE_INFERENCE | HK_MODE_TRAINING)
#include "rotary_table.inc"
