# HkKernelRepo.cmake — build a kernel repo for each variant and publish it into a hub tree.
#
#   hk_add_kernel_repo(NAME rmsnorm REPO kernels-community/rmsnorm VERSION 1.2.0
#                      [BRANCH v1] [TAGS v1.2.0-extra ...]
#                      [DESCRIPTION "what code this is"]  (metadata provenance.description; no ";")
#                      CPU_SOURCES a.cc ... [CUDA_SOURCES b.cu b_library.cc ...]
#                      [HUB_DIR dir]          (default ${PROJECT_BINARY_DIR}/hub, the embedded hub)
#                      [SIGNING_KEY key.pem]  (sign each metadata.json at publish time; default
#                                              the cache variable HK_KERNEL_SIGNING_KEY, empty =
#                                              unsigned; make a key with `hk kernels keygen`)
#                      [ABI_MAJOR n]          (test repos only: the ABI major the table claims)
#                      [NO_TABLE]             (test repos only: publish a .so that has no table)
#                      [TARGETS_VAR var])     (receives the variant targets, e.g. to link helpers)
#
# Two ways in, one behaviour:
#   - inside hk's own build (kernels/, tests/): include(${PROJECT_SOURCE_DIR}/cmake/HkKernelRepo.cmake).
#     The table dumper is built from tools/kernel-dump, kernels see hk's source include/.
#   - out of tree (the kernel SDK): find_package(hk) includes this file from the installed package
#     (<prefix>/lib/cmake/hk). It uses the installed dumper (imported target hk::kernel_dump) and
#     the installed include dir; HUB_DIR defaults to the *consumer's* ${PROJECT_BINARY_DIR}/hub.
#     CUDA variants are built when the consumer enables the CUDA language (archs from the cache
#     variable HK_CUDA_ARCHITECTURES, default 90a). See docs/writing-kernels.md.
#
# Variant targets are named hkk_<hub dir name>_<repo>_<version>_<cpu|cuda> passed through
# string(MAKE_C_IDENTIFIER) — stable, so a repo may link its own static helpers to them.
#
# One MODULE library per variant: `hk<abi>-cpu-<arch>-<os>` always (when CPU_SOURCES are given),
# `hk<abi>-cu<MM><m>-<arch>-<os>` when CUDA is enabled (archs from HK_CUDA_ARCHITECTURES). Kernels
# see include/ (hk_abi/hk_kernel.h, hk/kernel_sdk.h, ...) but never link libhk: they are linked
# with --no-undefined, so calling into libhk fails at build time, not at load time. Symbols are
# hidden except the table symbol. A per-repo target then runs cmake/hk_publish_repo.cmake, which
# dumps each table with hk-kernel-dump (the single source of the metadata's entries), derives the
# commit id from the content and writes
#   <hub>/<org>/<repo>/<commit>/build/<variant>/{lib<name>.so, metadata.json}
#   <hub>/<org>/<repo>/refs/heads/<branch>, refs/tags/v<version> (+ TAGS)  → commit id.
# Several versions of one repo may be published into one hub (each call is one version).
include_guard(GLOBAL)

# include_guard(GLOBAL) runs this file once, in the first directory that includes it: what later
# calls need from here is kept in the cache (INTERNAL), visible from every directory.
set(_HK_KERNEL_REPO_MODULE_DIR ${CMAKE_CURRENT_LIST_DIR} CACHE INTERNAL "")

if(TARGET hk::kernel_dump)
  # ---- installed package: hkConfig.cmake imported hk::kernel_dump and set HK_SDK_INCLUDE_DIR --
  if(NOT HK_SDK_INCLUDE_DIR OR NOT EXISTS "${HK_SDK_INCLUDE_DIR}/hk_abi/hk_kernel.h")
    message(FATAL_ERROR "HkKernelRepo.cmake: the hk package has no kernel headers at "
                        "'${HK_SDK_INCLUDE_DIR}'; reinstall hk (cmake --install) and use "
                        "find_package(hk) instead of including this file directly.")
  endif()
  set(_HK_SDK_INSTALLED TRUE CACHE INTERNAL "")
  set(_HK_SDK_INCLUDE_DIR ${HK_SDK_INCLUDE_DIR} CACHE INTERNAL "")
  # A path, not a target: the imported target is only visible in the directory that called
  # find_package, while hk_add_kernel_repo may be called from any directory below it.
  get_target_property(_hk_dump_location hk::kernel_dump LOCATION)
  set(_HK_KERNEL_DUMP ${_hk_dump_location} CACHE INTERNAL "")
  set(_HK_KERNEL_DUMP_DEPENDS ${_hk_dump_location} CACHE INTERNAL "")
  # The signer is the installed hk CLI, installed beside the dumper.
  get_filename_component(_hk_bin_dir ${_hk_dump_location} DIRECTORY)
  set(_HK_SIGNER ${_hk_bin_dir}/hk CACHE INTERNAL "")
  set(_HK_SIGNER_DEPENDS ${_hk_bin_dir}/hk CACHE INTERNAL "")
  set(_HK_SDK_BUILDER "hk ${HK_SDK_VERSION}" CACHE INTERNAL "")
  set(HK_CUDA_ARCHITECTURES "90a" CACHE STRING
      "CUDA architectures of the kernels' cuda variants (e.g. 90a;80)")
else()
  # ---- inside hk's build: the dumper from source, the kernels see hk's include/ ----------------
  if(NOT EXISTS ${PROJECT_SOURCE_DIR}/tools/kernel-dump/main.cc)
    message(FATAL_ERROR "HkKernelRepo.cmake is included outside hk's source tree: call "
                        "find_package(hk REQUIRED) instead (it provides hk_add_kernel_repo).")
  endif()
  set(_HK_SDK_INSTALLED FALSE CACHE INTERNAL "")
  set(_HK_SDK_INCLUDE_DIR ${PROJECT_SOURCE_DIR}/include CACHE INTERNAL "")
  # The table dumper used by every publish step (see tools/kernel-dump/main.cc).
  if(NOT TARGET hk_kernel_dump)
    add_executable(hk_kernel_dump ${PROJECT_SOURCE_DIR}/tools/kernel-dump/main.cc)
    set_target_properties(hk_kernel_dump PROPERTIES OUTPUT_NAME hk-kernel-dump
                          RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin
                          EXPORT_NAME kernel_dump)
    target_include_directories(hk_kernel_dump PRIVATE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(hk_kernel_dump PRIVATE nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
  endif()
  set(_HK_KERNEL_DUMP "$<TARGET_FILE:hk_kernel_dump>" CACHE INTERNAL "")
  set(_HK_KERNEL_DUMP_DEPENDS hk_kernel_dump CACHE INTERNAL "")
  set(_HK_SIGNER "$<TARGET_FILE:hk_cli>" CACHE INTERNAL "")
  set(_HK_SIGNER_DEPENDS hk_cli CACHE INTERNAL "")
endif()
set(HK_KERNEL_SIGNING_KEY "" CACHE FILEPATH
    "Ed25519 private key (PEM) that signs every published kernel repo's metadata.json; empty = unsigned")

# Kernel libraries export exactly the table symbol (everything else stays local to the library).
set(_HK_KERNEL_EXPORTS_MAP ${PROJECT_BINARY_DIR}/CMakeFiles/hk_kernel_exports.map CACHE INTERNAL "")
file(WRITE ${_HK_KERNEL_EXPORTS_MAP} "{\n  global: hk_kernel_library_v*;\n  local: *;\n};\n")

# ABI major/minor of these headers, read from the C header (the one place they are written).
file(STRINGS ${_HK_SDK_INCLUDE_DIR}/hk_abi/hk_kernel.h _hk_abi_line
     REGEX "^#define HK_KERNEL_ABI_MAJOR [0-9]+")
string(REGEX REPLACE "^#define HK_KERNEL_ABI_MAJOR ([0-9]+).*" "\\1" _hk_abi_major
       "${_hk_abi_line}")
set(HK_KERNEL_ABI_MAJOR_VALUE ${_hk_abi_major} CACHE INTERNAL "")
file(STRINGS ${_HK_SDK_INCLUDE_DIR}/hk_abi/hk_kernel.h _hk_abi_line
     REGEX "^#define HK_KERNEL_ABI_MINOR [0-9]+")
string(REGEX REPLACE "^#define HK_KERNEL_ABI_MINOR ([0-9]+).*" "\\1" _hk_abi_minor
       "${_hk_abi_line}")
set(HK_KERNEL_ABI_MINOR_VALUE ${_hk_abi_minor} CACHE INTERNAL "")
if(NOT HK_KERNEL_ABI_MAJOR_VALUE MATCHES "^[0-9]+$" OR NOT HK_KERNEL_ABI_MINOR_VALUE MATCHES "^[0-9]+$")
  message(FATAL_ERROR "HkKernelRepo.cmake: cannot read HK_KERNEL_ABI_MAJOR/MINOR from "
                      "${_HK_SDK_INCLUDE_DIR}/hk_abi/hk_kernel.h")
endif()

# Capability range of device code built for `archs` (e.g. "90a;80"): the lowest arch, and the
# highest when every arch is arch-specific (a/f suffix: no PTX to JIT forward), else 0 (no bound).
function(_hk_capability_range archs out_min out_max)
  set(lo 0)
  set(hi 0)
  set(all_specific TRUE)
  foreach(a ${archs})
    string(REGEX MATCH "^([0-9]+)([af]?)" _ "${a}")
    set(num ${CMAKE_MATCH_1})
    if(NOT CMAKE_MATCH_2)
      set(all_specific FALSE)
    endif()
    if(lo EQUAL 0 OR num LESS lo)
      set(lo ${num})
    endif()
    if(num GREATER hi)
      set(hi ${num})
    endif()
  endforeach()
  if(NOT all_specific)
    set(hi 0)
  endif()
  set(${out_min} ${lo} PARENT_SCOPE)
  set(${out_max} ${hi} PARENT_SCOPE)
endfunction()

function(hk_add_kernel_repo)
  cmake_parse_arguments(K "NO_TABLE"
                        "NAME;REPO;VERSION;BRANCH;HUB_DIR;ABI_MAJOR;TARGETS_VAR;DESCRIPTION;SIGNING_KEY"
                        "TAGS;CPU_SOURCES;CUDA_SOURCES" ${ARGN})
  if(K_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "hk_add_kernel_repo: unknown arguments ${K_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT K_NAME MATCHES "^[A-Za-z0-9_]+$")
    message(FATAL_ERROR "hk_add_kernel_repo: NAME '${K_NAME}' must be a C identifier-like name")
  endif()
  if(NOT K_REPO MATCHES "^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    message(FATAL_ERROR "hk_add_kernel_repo: REPO '${K_REPO}' must look like org/repo")
  endif()
  if(NOT K_VERSION MATCHES "^([0-9]+)\\.[0-9]+\\.[0-9]+$")
    message(FATAL_ERROR "hk_add_kernel_repo: VERSION '${K_VERSION}' must be X.Y.Z")
  endif()
  set(major ${CMAKE_MATCH_1})
  if(NOT K_BRANCH)
    set(K_BRANCH v${major})
  endif()
  if(NOT K_HUB_DIR)
    set(K_HUB_DIR ${PROJECT_BINARY_DIR}/hub)
  endif()
  if(NOT K_ABI_MAJOR)
    set(K_ABI_MAJOR ${HK_KERNEL_ABI_MAJOR_VALUE})
  endif()
  if(NOT K_SIGNING_KEY)
    set(K_SIGNING_KEY "${HK_KERNEL_SIGNING_KEY}")
  endif()
  set(sign_depends "")
  if(K_SIGNING_KEY)
    get_filename_component(K_SIGNING_KEY "${K_SIGNING_KEY}" ABSOLUTE)
    if(NOT EXISTS "${K_SIGNING_KEY}")
      message(FATAL_ERROR "hk_add_kernel_repo(${K_REPO}): SIGNING_KEY ${K_SIGNING_KEY} does not "
                          "exist (make one with `hk kernels keygen FILE`)")
    endif()
    set(sign_depends ${_HK_SIGNER_DEPENDS} ${K_SIGNING_KEY})
  endif()
  if(NOT K_CPU_SOURCES AND NOT K_CUDA_SOURCES)
    message(FATAL_ERROR "hk_add_kernel_repo(${K_REPO}): give CPU_SOURCES and/or CUDA_SOURCES")
  endif()

  string(TOLOWER "${CMAKE_SYSTEM_PROCESSOR}" arch)
  if(arch STREQUAL "amd64")
    set(arch x86_64)
  endif()
  string(TOLOWER "${CMAKE_SYSTEM_NAME}" os)
  get_filename_component(hub_name "${K_HUB_DIR}" NAME)
  string(MAKE_C_IDENTIFIER "hkk_${hub_name}_${K_REPO}_${K_VERSION}" base)
  set(work_dir ${CMAKE_CURRENT_BINARY_DIR}/${base})
  file(RELATIVE_PATH source_label ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  if(source_label STREQUAL "")
    set(source_label .)  # a kernel repo at the top of its own project
  endif()
  if(_HK_SDK_INSTALLED)
    set(builder "${_HK_SDK_BUILDER}")
    # The consumer decides whether there is CUDA by enabling the language (project(... CUDA) or
    # enable_language(CUDA)), before or after find_package(hk).
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    set(build_cuda FALSE)
    if(K_CUDA_SOURCES AND "CUDA" IN_LIST languages)
      set(build_cuda TRUE)
      if(NOT TARGET CUDA::cudart OR NOT CUDAToolkit_VERSION_MAJOR)
        find_package(CUDAToolkit REQUIRED)
      endif()
    endif()
  else()
    set(builder "hk ${PROJECT_VERSION}")
    set(build_cuda ${HK_HAVE_CUDA})
  endif()

  set(variants "")
  set(variant_targets "")
  set(args "")

  # One MODULE library for the variant named by `variant`, of `backend`, from `sources`.
  macro(_hk_variant)
    set(tgt ${base}_${backend})
    add_library(${tgt} MODULE ${sources})
    set_target_properties(${tgt} PROPERTIES
      OUTPUT_NAME ${K_NAME} PREFIX "lib" SUFFIX ".so"
      LIBRARY_OUTPUT_DIRECTORY ${work_dir}/${variant}
      CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
    target_include_directories(${tgt} PRIVATE ${_HK_SDK_INCLUDE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
    target_compile_definitions(${tgt} PRIVATE
      HK_KERNEL_REPO="${K_REPO}" HK_KERNEL_VERSION="${K_VERSION}"
      HK_KERNEL_BUILD_ID="${K_NAME}-${K_VERSION}-${variant}" HK_SDK_ABI_MAJOR=${K_ABI_MAJOR})
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
    # GNU "unique" symbols (inline statics) bind process-wide even under RTLD_LOCAL and pin the
    # library in memory; kernels must stay private to their handle.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-gnu-unique>
                                            $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fno-gnu-unique>)
    endif()
    target_link_options(${tgt} PRIVATE LINKER:--no-undefined
                        LINKER:--version-script=${_HK_KERNEL_EXPORTS_MAP})
    set_property(TARGET ${tgt} APPEND PROPERTY LINK_DEPENDS ${_HK_KERNEL_EXPORTS_MAP})
    if(_HK_SDK_INSTALLED)
      # hk's own build sets these for every target; a consumer project may not. kernel_sdk.h's
      # entry declarations use C++20 designated initialisers; device code is C++17 as in hk.
      target_compile_features(${tgt} PRIVATE cxx_std_20)
      if(backend STREQUAL "cuda" AND NOT DEFINED CMAKE_CUDA_STANDARD)
        set_target_properties(${tgt} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
      endif()
    endif()
    list(APPEND variants ${variant})
    list(APPEND variant_targets ${tgt})
    string(APPEND args "set(\"VARIANT_${variant}_FILE\" \"$<TARGET_FILE:${tgt}>\")\n")
    string(APPEND args "set(\"VARIANT_${variant}_BACKEND\" \"${backend}\")\n")
  endmacro()

  if(K_CPU_SOURCES)
    set(variant hk${K_ABI_MAJOR}-cpu-${arch}-${os})
    set(backend cpu)
    set(sources ${K_CPU_SOURCES})
    _hk_variant()
    string(APPEND args "set(\"VARIANT_${variant}_COMPILER\" "
                       "\"${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}\")\n")
  endif()
  if(K_CUDA_SOURCES AND build_cuda)
    set(cu "${CUDAToolkit_VERSION_MAJOR}${CUDAToolkit_VERSION_MINOR}")
    set(variant hk${K_ABI_MAJOR}-cu${cu}-${arch}-${os})
    set(backend cuda)
    set(sources ${K_CUDA_SOURCES})
    _hk_variant()
    _hk_capability_range("${HK_CUDA_ARCHITECTURES}" cap_min cap_max)
    set_target_properties(${tgt} PROPERTIES CUDA_ARCHITECTURES "${HK_CUDA_ARCHITECTURES}"
                          BUILD_RPATH "${CUDAToolkit_LIBRARY_DIR}")
    target_compile_definitions(${tgt} PRIVATE HK_KERNEL_MIN_CAPABILITY=${cap_min}
                                              HK_KERNEL_MAX_CAPABILITY=${cap_max})
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr
                                          -lineinfo>)
    target_link_libraries(${tgt} PRIVATE CUDA::cudart)
    string(APPEND args "set(\"VARIANT_${variant}_BACKEND_VERSION\" "
                       "\"${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}\")\n")
    string(APPEND args "set(\"VARIANT_${variant}_ARCHS\" \"${HK_CUDA_ARCHITECTURES}\")\n")
    string(APPEND args "set(\"VARIANT_${variant}_COMPILER\" \"${CMAKE_CXX_COMPILER_ID} "
                       "${CMAKE_CXX_COMPILER_VERSION}, nvcc ${CMAKE_CUDA_COMPILER_VERSION}\")\n")
  endif()
  if(K_TARGETS_VAR)
    set(${K_TARGETS_VAR} ${variant_targets} PARENT_SCOPE)
  endif()
  if(NOT variants)
    return()  # CUDA-only repo in a build without CUDA
  endif()

  string(REPLACE "/" "_" lock_name "${hub_name}_${K_REPO}")
  set(args_file ${work_dir}/publish_args.cmake)
  file(GENERATE OUTPUT ${args_file} CONTENT
"set(HUB_DIR \"${K_HUB_DIR}\")
set(REPO \"${K_REPO}\")
set(NAME \"${K_NAME}\")
set(VERSION \"${K_VERSION}\")
set(BRANCH \"${K_BRANCH}\")
set(TAGS \"v${K_VERSION};${K_TAGS}\")
set(ABI_MAJOR ${K_ABI_MAJOR})
set(ABI_MINOR ${HK_KERNEL_ABI_MINOR_VALUE})
set(NO_TABLE ${K_NO_TABLE})
set(DUMP \"${_HK_KERNEL_DUMP}\")
set(SOURCE \"${source_label}\")
set(BUILDER \"${builder}\")
set(DESCRIPTION [==[${K_DESCRIPTION}]==])
set(BUILD_TYPE \"${CMAKE_BUILD_TYPE}\")
set(OS \"${os}\")
set(ARCH \"${arch}\")
set(LOCK_FILE \"${PROJECT_BINARY_DIR}/CMakeFiles/hk-hub-locks/${lock_name}.lock\")
set(STAMP \"${work_dir}/published.stamp\")
set(VARIANTS \"${variants}\")
set(SIGNING_KEY \"${K_SIGNING_KEY}\")
set(SIGNER \"${_HK_SIGNER}\")
${args}")

  # The version tag is always (re)written by the publish step: listing it as an output makes a
  # deleted hub tree publish again on the next build.
  add_custom_command(
    OUTPUT ${work_dir}/published.stamp ${K_HUB_DIR}/${K_REPO}/refs/tags/v${K_VERSION}
    COMMAND ${CMAKE_COMMAND} -DARGS_FILE=${args_file} -P
            ${_HK_KERNEL_REPO_MODULE_DIR}/hk_publish_repo.cmake
    DEPENDS ${variant_targets} ${_HK_KERNEL_DUMP_DEPENDS} ${args_file}
            ${_HK_KERNEL_REPO_MODULE_DIR}/hk_publish_repo.cmake ${sign_depends}
    COMMENT "Publishing ${K_REPO} ${K_VERSION} (${variants}) into ${K_HUB_DIR}"
    VERBATIM)
  add_custom_target(${base}_publish ALL DEPENDS ${work_dir}/published.stamp)
  # Everything that needs this hub (tests, the CLI) can depend on one target per hub.
  string(MAKE_C_IDENTIFIER "hk_publish_${hub_name}" hub_target)
  if(NOT TARGET ${hub_target})
    add_custom_target(${hub_target} ALL)
  endif()
  add_dependencies(${hub_target} ${base}_publish)
endfunction()
