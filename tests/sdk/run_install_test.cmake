# run_install_test.cmake — a fresh-prefix install as a user makes it (registered by
# tests/sdk/CMakeLists.txt as test_install_fresh_prefix).
#
#   cmake -DHK_BINARY_DIR=<hk build> -DHK_SOURCE_DIR=<hk source> -DWORK_DIR=<scratch>
#         -DGENERATOR=Ninja -DCXX_COMPILER=c++ [-DCXX_COMPILER_LAUNCHER=ccache]
#         [-DBUILD_TYPE=Release] [-DCXX_FLAGS=... -DEXE_LINKER_FLAGS=...] -P this
#
# 1. `cmake --install` into WORK_DIR/prefix: the CLI, libhk, headers, hk.pc, the CMake package and
#    the embedded hub under share/hk/hub;
# 2. the installed `hk` with no HK_HUB_DIR finds that hub: `hk kernels list` names the repos and
#    `hk generate --use-kernels --json` binds kernels (the same ids as without kernels);
# 3. a consumer program (tests/sdk/consumer) built twice against the prefix — with
#    `pkg-config --cflags --libs hk` and with find_package(hk) — links, runs, and binds kernels
#    from the same installed hub (one lookup for the library and the CLI).
# Any failed step is a FATAL_ERROR naming the step and the command's output.
cmake_minimum_required(VERSION 3.25)
foreach(var HK_BINARY_DIR HK_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT ${var})
    message(FATAL_ERROR "run_install_test.cmake: pass -D${var}=...")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/sdk_test_util.cmake)

set(prefix ${WORK_DIR}/prefix)
set(model ${HK_SOURCE_DIR}/tests/fixtures/models/qwen3-tiny)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# ---- 1. install --------------------------------------------------------------------------------
run("install hk into ${prefix}" out COMMAND ${CMAKE_COMMAND} --install ${HK_BINARY_DIR}
    --prefix ${prefix})
file(GLOB_RECURSE pc_files ${prefix}/*/hk.pc)
file(GLOB hub_repos LIST_DIRECTORIES true ${prefix}/share/hk/hub/kernels-community/*)
if(NOT pc_files OR NOT hub_repos OR NOT EXISTS ${prefix}/bin/hk)
  message(FATAL_ERROR "install: expected bin/hk, a hk.pc and share/hk/hub/kernels-community/* "
                      "under ${prefix}")
endif()
file(READ ${pc_files} pc)
string(FIND "${pc}" "/usr/local" at)
if(NOT at LESS 0)
  message(FATAL_ERROR "install: hk.pc names /usr/local instead of its own prefix:\n${pc}")
endif()

# ---- 2. the installed CLI finds the installed hub ----------------------------------------------
set(env ${CMAKE_COMMAND} -E env --unset=HK_HUB_DIR --unset=HK_ENDPOINT --unset=LOCAL_KERNELS
    --unset=HF_HUB_OFFLINE --unset=HK_HUB_OFFLINE --unset=USE_HUB_KERNELS
    HK_KERNELS_CACHE=${WORK_DIR}/cache)
run("installed hk kernels list" list COMMAND ${env} ${prefix}/bin/hk kernels list)
foreach(repo kernels-community/liger-kernels kernels-community/rmsnorm kernels-community/rotary
        kernels-community/activation)
  expect_contains("installed hk kernels list" "${list}" "${repo}")
endforeach()
run("installed hk generate --use-kernels" gen COMMAND ${env} ${prefix}/bin/hk generate
    --model ${model} --ids 1,2,3 --max-new-tokens 3 --use-kernels --json)
string(REGEX MATCHALL "\"kernel\":\"kernels-community/[^\"]+\"" bound "${gen}")
list(LENGTH bound n_bound)
if(n_bound EQUAL 0)
  message(FATAL_ERROR "installed hk generate --use-kernels bound no kernel:\n${gen}")
endif()
string(REGEX MATCH "\"ids\":\\[[0-9,]*\\]" ids_kernels "${gen}")
run("installed hk generate" plain COMMAND ${env} ${prefix}/bin/hk generate --model ${model}
    --ids 1,2,3 --max-new-tokens 3 --json)
string(REGEX MATCH "\"ids\":\\[[0-9,]*\\]" ids_plain "${plain}")
if(NOT ids_kernels OR NOT ids_kernels STREQUAL ids_plain)
  message(FATAL_ERROR "installed hk: ids with kernels (${ids_kernels}) differ from built-in "
                      "(${ids_plain})")
endif()
message(STATUS "ok: the installed hk binds ${n_bound} layers to kernels, ${ids_kernels}")

# ---- 3. consumers: pkg-config and CMake --------------------------------------------------------
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
set(consumer_src ${CMAKE_CURRENT_LIST_DIR}/consumer)
get_filename_component(pc_dir ${pc_files} DIRECTORY)
run("pkg-config --cflags --libs hk" pkg COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir}
    pkg-config --cflags --libs hk)
string(STRIP "${pkg}" pkg)
separate_arguments(pkg_flags UNIX_COMMAND "${pkg}")
separate_arguments(extra_flags UNIX_COMMAND "${CXX_FLAGS} ${EXE_LINKER_FLAGS}")
get_filename_component(libdir ${pc_dir} DIRECTORY)
run("build the consumer with pkg-config" out COMMAND ${CXX_COMPILER} -std=c++20 ${extra_flags}
    ${consumer_src}/consumer.cc ${pkg_flags} -Wl,-rpath,${libdir} -o ${WORK_DIR}/consumer_pc)
run("run the pkg-config consumer" pc_run COMMAND ${env} ${WORK_DIR}/consumer_pc ${model})

set(configure_args -S ${consumer_src} -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}"
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CXX_COMPILER_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_COMPILER_LAUNCHER})
endif()
run("configure the consumer with find_package(hk)" out COMMAND ${CMAKE_COMMAND} ${configure_args})
run("build the CMake consumer" out COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run("run the CMake consumer" cmake_run COMMAND ${env} ${WORK_DIR}/consumer-build/hk_consumer
    ${model})

foreach(kind pc cmake)
  string(REGEX MATCH "kernels ([0-9]+)" _ "${${kind}_run}")
  if(NOT CMAKE_MATCH_1 OR CMAKE_MATCH_1 EQUAL 0)
    message(FATAL_ERROR "the ${kind} consumer bound no kernel from the installed hub:\n"
                        "${${kind}_run}")
  endif()
  if(NOT CMAKE_MATCH_1 EQUAL n_bound)
    message(FATAL_ERROR "the ${kind} consumer bound ${CMAKE_MATCH_1} kernels, the installed CLI "
                        "${n_bound}: the library and the CLI must find the same hub")
  endif()
endforeach()
message(STATUS "ok: both consumers link, run and bind ${n_bound} kernels")
