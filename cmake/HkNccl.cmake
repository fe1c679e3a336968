# NCCL for data-parallel training on CUDA (src/train/distributed/nccl_process_group.cc).
#
# HK_NCCL=AUTO (default) builds the NCCL backend when headers and library are found, ON requires
# them, OFF skips them. Debian has no NCCL package, so hk uses NVIDIA's PyPI wheel
# (nvidia-nccl-cu13): scripts/install-deps unpacks it into /opt/hk-nccl, and a Python that has it
# in its site-packages (the GPU machine's, beside torch) is asked for its directory. Search order:
# HK_NCCL_ROOT / $NCCL_ROOT, /opt/hk-nccl, the Python wheel, the CUDA toolkit, system paths. The
# library is linked (its directory goes into the build RPATH), not dlopen'ed.
set(HK_NCCL "AUTO" CACHE STRING "Build the NCCL backend: AUTO, ON or OFF")
set_property(CACHE HK_NCCL PROPERTY STRINGS AUTO ON OFF)
set(HK_NCCL_ROOT "" CACHE PATH "Directory holding include/nccl.h and lib/libnccl.so*")
set(HK_HAVE_NCCL OFF)

if(HK_HAVE_CUDA AND NOT HK_NCCL STREQUAL "OFF")
  set(_hk_nccl_hints)
  if(HK_NCCL_ROOT)
    list(APPEND _hk_nccl_hints ${HK_NCCL_ROOT})
  endif()
  if(DEFINED ENV{NCCL_ROOT})
    list(APPEND _hk_nccl_hints $ENV{NCCL_ROOT})
  endif()
  list(APPEND _hk_nccl_hints /opt/hk-nccl/nvidia/nccl)
  find_program(HK_PYTHON3 NAMES python3)
  if(HK_PYTHON3)
    # nvidia/nccl is a namespace package in the cu13 wheels (no __init__.py): __path__, not
    # __file__.
    execute_process(
      COMMAND ${HK_PYTHON3} -c
              "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _hk_nccl_py ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _hk_nccl_py_rc TIMEOUT 30)
    if(_hk_nccl_py_rc EQUAL 0 AND _hk_nccl_py)
      list(APPEND _hk_nccl_hints ${_hk_nccl_py})
    endif()
  endif()
  get_filename_component(_hk_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _hk_nccl_hints ${_hk_cuda_root} ${CUDAToolkit_LIBRARY_ROOT})

  find_path(HK_NCCL_INCLUDE_DIR nccl.h HINTS ${_hk_nccl_hints} PATH_SUFFIXES include)
  # The wheel ships only libnccl.so.2 (no libnccl.so symlink).
  find_library(HK_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_hk_nccl_hints}
               PATH_SUFFIXES lib lib64)
  if(HK_NCCL_INCLUDE_DIR AND HK_NCCL_LIBRARY)
    file(STRINGS ${HK_NCCL_INCLUDE_DIR}/nccl.h _hk_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
                         "\\1.\\2.\\3" HK_NCCL_VERSION "${_hk_nccl_version}")
    add_library(hk_nccl UNKNOWN IMPORTED)
    set_target_properties(hk_nccl PROPERTIES IMPORTED_LOCATION ${HK_NCCL_LIBRARY}
                                             INTERFACE_INCLUDE_DIRECTORIES ${HK_NCCL_INCLUDE_DIR})
    set(HK_HAVE_NCCL ON)
  elseif(HK_NCCL STREQUAL "ON")
    message(FATAL_ERROR "HK_NCCL=ON but NCCL was not found (looked in: ${_hk_nccl_hints}); run "
                        "scripts/install-deps (installs NVIDIA's nvidia-nccl-cu13 wheel into "
                        "/opt/hk-nccl) or set HK_NCCL_ROOT.")
  endif()
elseif(HK_NCCL STREQUAL "ON")
  message(FATAL_ERROR "HK_NCCL=ON needs CUDA (HK_CUDA is OFF or no nvcc was found).")
endif()
if(HK_HAVE_NCCL)
  message(STATUS "hk: NCCL ${HK_NCCL_VERSION}: ${HK_NCCL_LIBRARY} (headers ${HK_NCCL_INCLUDE_DIR})")
elseif(HK_NCCL STREQUAL "OFF")
  message(STATUS "hk: NCCL backend OFF (HK_NCCL=OFF): data-parallel training on cuda is "
                 "unavailable (CPU ranks still work)")
elseif(NOT HK_HAVE_CUDA)
  message(STATUS "hk: NCCL backend OFF (no CUDA): data-parallel training runs on CPU ranks only")
else()
  message(STATUS "hk: NCCL backend OFF: nccl.h / libnccl not found (looked in: "
                 "${_hk_nccl_hints}); data-parallel training on cuda is unavailable. Run "
                 "scripts/install-deps (NVIDIA's nvidia-nccl-cu13 wheel into /opt/hk-nccl) or set "
                 "HK_NCCL_ROOT")
endif()
