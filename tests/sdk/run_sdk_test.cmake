# run_sdk_test.cmake — the out-of-tree kernel repo test (registered by tests/sdk/CMakeLists.txt).
#
#   cmake -DHK_BINARY_DIR=<hk build> -DREPO_SOURCE_DIR=<tests/sdk/my-rmsnorm> -DWORK_DIR=<scratch>
#         -DGENERATOR=Ninja -DCXX_COMPILER=c++ [-DCXX_COMPILER_LAUNCHER=ccache] [-DBUILD_TYPE=Release]
#         [-DCXX_FLAGS=... -DEXE_LINKER_FLAGS=... -DMODULE_LINKER_FLAGS=...] -P this
#
# 1. `cmake --install` hk's build tree into WORK_DIR/prefix (what a user installs);
# 2. configure + build my-rmsnorm against that prefix only (CMAKE_PREFIX_PATH; the package
#    registry is off and hk_DIR must point into the prefix);
# 3. the published hub tree: refs/tags/v0.1.0 and refs/heads/v0 name one commit whose
#    build/hk<abi>-cpu-<arch>-<os>/ has libmy_rmsnorm.so and a metadata.json that lists MyRMSNorm
#    with the digest of that file;
# 4. the installed `hk` with HK_HUB_DIR = that hub: `kernels info --json` (same commit, the entry),
#    `kernels explain` (the cpu variant chosen), `kernels verify --load` refused without trust and
#    passing with --trust-remote-code;
# 5. my_rmsnorm_check: loads the kernel through hk's hub + loader and compares it with
#    hk::ops::rms_norm.
# Any failed step is a FATAL_ERROR naming the step and the command's output (ctest: failed).
# It does not test CUDA variants (CI has no GPU) nor serving the hub over HTTP (tests/hub does).
cmake_minimum_required(VERSION 3.25)
foreach(var HK_BINARY_DIR REPO_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT ${var})
    message(FATAL_ERROR "run_sdk_test.cmake: pass -D${var}=...")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(repo_build ${WORK_DIR}/my-rmsnorm-build)
set(hub ${repo_build}/hub)
set(repo someorg/my-rmsnorm)

include(${CMAKE_CURRENT_LIST_DIR}/sdk_test_util.cmake)

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# ---- 1. install --------------------------------------------------------------------------------
run("install hk into ${prefix}" out COMMAND ${CMAKE_COMMAND} --install ${HK_BINARY_DIR}
    --prefix ${prefix})
foreach(f bin/hk bin/hk-kernel-dump include/hk/kernel_sdk.h include/hk_abi/hk_kernel.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install: ${prefix}/${f} is missing")
  endif()
endforeach()
file(GLOB_RECURSE config_files ${prefix}/*/hkConfig.cmake)
list(LENGTH config_files n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "install: expected one hkConfig.cmake under ${prefix}, found '${config_files}'")
endif()
get_filename_component(hk_config_dir ${config_files} DIRECTORY)
foreach(f HkKernelRepo.cmake hk_publish_repo.cmake hkTargets.cmake)
  if(NOT EXISTS ${hk_config_dir}/${f})
    message(FATAL_ERROR "install: ${hk_config_dir}/${f} is missing")
  endif()
endforeach()

# ---- 2. configure + build the out-of-tree kernel repo ------------------------------------------
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
set(configure_args -S ${REPO_SOURCE_DIR} -B ${repo_build} -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}"
    "-DCMAKE_MODULE_LINKER_FLAGS=${MODULE_LINKER_FLAGS}"
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_COMPILER_LAUNCHER})
endif()
run("configure my-rmsnorm against the installed hk" out COMMAND ${CMAKE_COMMAND} ${configure_args})
file(STRINGS ${repo_build}/CMakeCache.txt hk_dir_line REGEX "^hk_DIR:")
string(REGEX REPLACE "^hk_DIR:[A-Z]+=" "" hk_dir "${hk_dir_line}")
if(NOT hk_dir STREQUAL hk_config_dir)
  message(FATAL_ERROR "configure: found hk at '${hk_dir}', not in the install prefix "
                      "(${hk_config_dir})")
endif()
run("build my-rmsnorm" out COMMAND ${CMAKE_COMMAND} --build ${repo_build})
expect_contains("build my-rmsnorm" "${out}" "Publishing ${repo} 0.1.0")

# ---- 3. the published hub tree -----------------------------------------------------------------
foreach(ref tags/v0.1.0 heads/v0)
  if(NOT EXISTS ${hub}/${repo}/refs/${ref})
    message(FATAL_ERROR "hub: ${hub}/${repo}/refs/${ref} was not published")
  endif()
  file(READ ${hub}/${repo}/refs/${ref} commit_${ref})
  string(STRIP "${commit_${ref}}" commit_${ref})
endforeach()
set(commit ${commit_tags/v0.1.0})
if(NOT commit MATCHES "^[0-9a-f]+$" OR NOT commit STREQUAL commit_heads/v0)
  message(FATAL_ERROR "hub: refs/tags/v0.1.0 (${commit}) and refs/heads/v0 (${commit_heads/v0}) "
                      "must name one 40-hex commit")
endif()
file(GLOB variant_dirs LIST_DIRECTORIES true ${hub}/${repo}/${commit}/build/*)
list(LENGTH variant_dirs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "hub: expected one (cpu) variant in ${hub}/${repo}/${commit}/build, found "
                      "'${variant_dirs}'")
endif()
get_filename_component(variant ${variant_dirs} NAME)
if(NOT variant MATCHES "^hk[0-9]+-cpu-[a-z0-9_]+-[a-z]+$")
  message(FATAL_ERROR "hub: variant '${variant}' is not named hk<abi>-cpu-<arch>-<os>")
endif()
set(lib ${variant_dirs}/libmy_rmsnorm.so)
if(NOT EXISTS ${lib} OR NOT EXISTS ${variant_dirs}/metadata.json)
  message(FATAL_ERROR "hub: ${variant_dirs} lacks libmy_rmsnorm.so or metadata.json")
endif()
file(READ ${variant_dirs}/metadata.json meta)
string(JSON meta_repo GET "${meta}" repo)
string(JSON meta_version GET "${meta}" version)
string(JSON meta_id GET "${meta}" id)
string(JSON entry_name GET "${meta}" entries 0 name)
string(JSON entry_interface GET "${meta}" entries 0 interface)
string(JSON meta_sha GET "${meta}" digest sha256 libmy_rmsnorm.so)
file(SHA256 ${lib} lib_sha)
if(NOT meta_repo STREQUAL repo OR NOT meta_version STREQUAL "0.1.0" OR NOT meta_id STREQUAL commit
   OR NOT entry_name STREQUAL "MyRMSNorm" OR NOT entry_interface STREQUAL "rms_norm"
   OR NOT meta_sha STREQUAL lib_sha)
  message(FATAL_ERROR "hub: metadata.json does not describe the published library:\n${meta}")
endif()
message(STATUS "ok: published ${repo} 0.1.0 as ${commit} (${variant})")

# ---- 4. the installed hk reads it --------------------------------------------------------------
set(env ${CMAKE_COMMAND} -E env --unset=HK_ENDPOINT --unset=LOCAL_KERNELS --unset=HK_TRUSTED_ORGS
    --unset=HF_HUB_OFFLINE --unset=HK_HUB_OFFLINE HK_HUB_DIR=${hub}
    HK_KERNELS_CACHE=${WORK_DIR}/cache)
set(hk ${prefix}/bin/hk)
set(spec ${repo}@v0.1.0:MyRMSNorm)

run("hk kernels info" info COMMAND ${env} ${hk} kernels info ${repo}@v0.1.0 --json)
string(JSON info_commit GET "${info}" revision)
string(JSON info_entries GET "${info}" variants 0 entries)
if(NOT info_commit STREQUAL commit)
  message(FATAL_ERROR "hk kernels info: revision ${info_commit}, published ${commit}\n${info}")
endif()
expect_contains("hk kernels info" "${info_entries}" "MyRMSNorm")

run("hk kernels explain" explain COMMAND ${env} ${hk} kernels explain ${spec} --trust-remote-code)
string(REGEX MATCH "chosen +${variant}" chosen "${explain}")
if(NOT chosen)
  message(FATAL_ERROR "hk kernels explain: ${variant} was not chosen:\n${explain}")
endif()

run("hk kernels verify refuses an untrusted org" verify EXPECT_FAILURE
    COMMAND ${env} ${hk} kernels verify ${spec} --load)
expect_contains("hk kernels verify (untrusted)" "${verify}" "trusted org")
run("hk kernels verify --load --trust-remote-code" verify
    COMMAND ${env} ${hk} kernels verify ${spec} --load --trust-remote-code)

# ---- 5. call it through hk's loader ------------------------------------------------------------
run("my_rmsnorm_check (hub + loader + call)" check COMMAND ${env} ${repo_build}/my_rmsnorm_check)
expect_contains("my_rmsnorm_check" "${check}" "forward: matches")
message(STATUS "${check}")
