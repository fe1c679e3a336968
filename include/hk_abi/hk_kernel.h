/* hk_abi/hk_kernel.h — the C ABI between hk and a kernel library (plain C, versioned).
 *
 * A kernel library is a shared object that exports exactly one symbol,
 *
 *     const hk_kernel_library* hk_kernel_library_v1(void);
 *
 * returning a static table: the ABI version it was built against, its repo/version/build id, and
 * its entries. Each entry implements one *layer interface* at one version (e.g. rms_norm@1, see
 * include/hk/layer_interfaces.h for the inputs, outputs and attribute struct of each interface)
 * for one device type, a capability range, a set of dtypes and a set of modes, through
 * `forward` / optional `backward` functions that take an `hk_call` and return an `hk_status`.
 *
 * Only the C types below cross the boundary: no C++ types, no exceptions, no allocation owned by
 * the other side. A failing kernel returns a non-OK status and writes one sentence into
 * `hk_call.error_message`. The library is loaded with RTLD_LOCAL, so its other symbols stay
 * private and two versions of one repo can live in one process; build it with hidden visibility.
 *
 * Versioning: HK_KERNEL_ABI_MAJOR changes when any struct or meaning here changes incompatibly
 * (hk refuses a library of another major). A minor bump only appends fields at the end of
 * `hk_call` (whose `struct_size` tells the kernel what it got) or of `hk_kernel_entry` (the host
 * strides the entry array by `hk_kernel_library.entry_size`), or adds new codes a kernel may
 * ignore.
 *
 * This header deliberately defines no helpers; the C++ SDK for kernel authors is
 * include/hk/kernel_sdk.h and the host-side loader is include/hk/kernel_loader.h.
 */
#ifndef HK_ABI_HK_KERNEL_H
#define HK_ABI_HK_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HK_KERNEL_ABI_MAJOR 1
#define HK_KERNEL_ABI_MINOR 0

/* The symbol every library of ABI major 1 exports, and its type. */
#define HK_KERNEL_LIBRARY_SYMBOL "hk_kernel_library_v1"

/* ---- status codes ----------------------------------------------------------------------------
 * Fixed-width integer rather than a C enum so its size is part of the ABI. */
typedef int32_t hk_status;
#define HK_STATUS_OK 0
#define HK_STATUS_INVALID_ARGUMENT 1 /* shapes/dtypes/devices/attrs the interface does not allow \
                                      */
#define HK_STATUS_UNSUPPORTED 2      /* valid call this kernel does not implement (dtype, layout) */
#define HK_STATUS_OUT_OF_MEMORY 3
#define HK_STATUS_DEVICE_ERROR 4 /* a CUDA/driver call failed */
#define HK_STATUS_INTERNAL 5     /* anything else (a bug in the kernel) */

/* ---- device types: DLPack's DLDeviceType codes (hk extensions from 1000) ----------------------
 */
#define HK_DEVICE_CPU 1
#define HK_DEVICE_CUDA 2
#define HK_DEVICE_METAL 8 /* "mps" */
#define HK_DEVICE_ROCM 10
#define HK_DEVICE_ONEAPI 14 /* "xpu" */
#define HK_DEVICE_NPU 1001

/* ---- element types: the codes of hk::DType, in the same order ------------------------------- */
#define HK_DTYPE_F32 0
#define HK_DTYPE_F16 1
#define HK_DTYPE_BF16 2
#define HK_DTYPE_I32 3
#define HK_DTYPE_I64 4
#define HK_DTYPE_U8 5
#define HK_DTYPE_BOOL 6
#define HK_DTYPE_F64 7
/* Bit for a dtype in hk_kernel_entry.dtypes. */
#define HK_DTYPE_BIT(code) (1u << (code))

/* ---- modes (hk_kernel_entry.modes bit flags) ------------------------------------------------- */
#define HK_MODE_INFERENCE 1u
#define HK_MODE_TRAINING 2u /* requires `backward` */
#define HK_MODE_CAPTURE 4u  /* CUDA-graph safe: no host sync, no allocation, no host reads */

/* ---- tensors ----------------------------------------------------------------------------------
 * Same meaning as DLPack's DLTensor and hk::TensorView: element [i0, i1, ...] lives at
 * (char*)data + byte_offset + (i0*strides[0] + i1*strides[1] + ...) * element_size.
 * `strides` are in elements and never NULL. An absent optional tensor has data == NULL and
 * ndim == 0 (a call may also pass fewer tensors than the interface lists: trailing optional ones).
 */
typedef struct hk_tensor {
  void* data;
  int32_t device_type; /* HK_DEVICE_* */
  int32_t device_id;
  int32_t dtype; /* HK_DTYPE_* */
  int32_t ndim;
  const int64_t* shape;
  const int64_t* strides;
  uint64_t byte_offset;
} hk_tensor;

/* ---- one call ---------------------------------------------------------------------------------
 * Inputs, outputs and attrs are laid out as the entry's layer interface says. Outputs are
 * preallocated by the caller; the kernel writes their elements. `attrs` points to the interface's
 * attribute struct; `attrs_size` is its size as the caller knows it (a kernel built against a
 * smaller or larger struct reads the common prefix and defaults the rest). `workspace` is device
 * scratch of at least the size the entry's `workspace_size` asked for (NULL/0 when none).
 * `stream` is a cudaStream_t (or the device's equivalent; NULL = default stream; ignored on cpu).
 * On failure the kernel writes one NUL-terminated sentence into error_message (when non-NULL),
 * truncating to error_message_size. */
typedef struct hk_call {
  uint32_t struct_size; /* sizeof(hk_call) as the caller was built */
  int32_t num_inputs;
  const hk_tensor* inputs;
  int32_t num_outputs;
  const hk_tensor* outputs;
  const void* attrs;
  size_t attrs_size;
  void* workspace;
  size_t workspace_size;
  void* stream;
  char* error_message;
  size_t error_message_size;
} hk_call;

typedef hk_status (*hk_kernel_fn)(const hk_call* call);

/* Which function a workspace query is for. */
#define HK_PASS_FORWARD 0u
#define HK_PASS_BACKWARD 1u
/* Writes to *bytes the workspace the given call needs (data pointers may be NULL; shapes, dtypes
 * and attrs are set). */
typedef hk_status (*hk_workspace_fn)(const hk_call* call, uint32_t pass, size_t* bytes);

/* ---- layouts (stateful kernels and fusions) ----------------------------------------------------
 * A layout says which parameters the kernel holds, in the order they follow the activations in
 * `inputs`, and how each is made from checkpoint tensors of the module(s) it replaces (keys are
 * relative to the replaced module, or to the common parent of a fusion, e.g.
 * "post_attention_layernorm.weight", "mlp.gate_proj.weight"). The host applies the conversions
 * when the checkpoint loads; parameters take the dtype of their sources. */
#define HK_CONVERT_RENAME 0u    /* one source, same tensor under a new name */
#define HK_CONVERT_CONCAT 1u    /* sources concatenated along `dim` */
#define HK_CONVERT_TRANSPOSE 2u /* one 2-D source, transposed */

typedef struct hk_conversion {
  const char* target; /* parameter name in the layout, e.g. "gate_up_proj.weight" */
  const char* const* sources;
  uint32_t num_sources;
  uint32_t op; /* HK_CONVERT_* */
  int32_t dim; /* for HK_CONVERT_CONCAT */
} hk_conversion;

typedef struct hk_layout {
  const char* name;              /* e.g. "RMSNormMLPLayout" */
  const char* const* parameters; /* parameter names, in call order */
  uint32_t num_parameters;
  const hk_conversion* conversions; /* one per parameter that is not a plain same-name copy */
  uint32_t num_conversions;
} hk_layout;

/* ---- entries ----------------------------------------------------------------------------------
 */
typedef struct hk_kernel_entry {
  const char* name;      /* "RMSNorm", "LigerRMSNorm" — what `org/repo:Entry` names */
  const char* interface; /* layer interface name, e.g. "rms_norm" */
  uint32_t interface_version;
  uint32_t modes;         /* HK_MODE_* bits */
  const char* device;     /* "cpu", "cuda", "rocm", "xpu", "mps", "npu" */
  int32_t min_capability; /* e.g. 90 for sm_90; 0 = no lower bound (and for cpu) */
  int32_t max_capability; /* 0 = no upper bound */
  uint32_t dtypes;        /* HK_DTYPE_BIT(...) of the floating dtypes it computes in */
  hk_kernel_fn forward;   /* never NULL */
  hk_kernel_fn backward;  /* NULL when the kernel has no backward (then no HK_MODE_TRAINING) */
  hk_workspace_fn workspace_size; /* NULL = needs no workspace */
  const hk_layout* layout;        /* NULL for stateless kernels */
} hk_kernel_entry;

/* ---- the library ------------------------------------------------------------------------------
 */
typedef struct hk_kernel_library {
  uint32_t abi_major; /* HK_KERNEL_ABI_MAJOR the library was built with */
  uint32_t abi_minor;
  const char* repo;     /* "kernels-community/rmsnorm" */
  const char* version;  /* "1.2.0" */
  const char* build_id; /* free text identifying the build (variant, compiler) */
  uint32_t entry_size;  /* sizeof(hk_kernel_entry) in the library's ABI */
  uint32_t num_entries;
  const hk_kernel_entry* entries;
} hk_kernel_library;

typedef const hk_kernel_library* (*hk_kernel_library_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HK_ABI_HK_KERNEL_H */
