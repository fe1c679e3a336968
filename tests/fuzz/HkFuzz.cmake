# hk_add_fuzz_target(NAME <name> SOURCES <files...> [LIBS <libs...>] [CORPUS <dir>])
#
# <files> define `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`. Always builds
# `<name>_replay`, which feeds every file of the corpus (CORPUS, relative to the calling directory;
# default tests/fuzz/corpus/<name>/) to that function, and registers it with ctest as
# `<name>_corpus` (label `fuzz`), so CI replays the corpus — including every crash ever found — on
# each run. With HK_BUILD_FUZZERS=ON and clang it also builds `<name>`,
# a libFuzzer binary (-fsanitize=fuzzer,address), and instruments the hk library for coverage and
# ASan; configure such a build in its own directory (see docs/fuzzing.md).
# Deliberately not here: running fuzzers in CI (they run by hand, results in docs/fuzzing.md).
include_guard(GLOBAL)

# include_guard(GLOBAL) runs this once, in the first directory that includes it: what the function
# needs later is in the cache (INTERNAL), visible from every directory.
set(HK_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR} CACHE INTERNAL "")
set(HK_FUZZ_REAL OFF CACHE INTERNAL "")
if(HK_BUILD_FUZZERS)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(HK_FUZZ_REAL ON CACHE INTERNAL "")
    # Coverage feedback and ASan inside the library are what make the fuzzer see the parsers;
    # the link option is PUBLIC so every executable of this build gets the ASan runtime.
    target_compile_options(hk PRIVATE -fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer)
    target_link_options(hk PUBLIC -fsanitize=address)
  else()
    message(WARNING "HK_BUILD_FUZZERS=ON needs clang (libFuzzer); building only the corpus "
                    "replay tests. Configure with CC=clang CXX=clang++.")
  endif()
endif()

function(hk_add_fuzz_target)
  cmake_parse_arguments(F "" "NAME;CORPUS" "SOURCES;LIBS" ${ARGN})
  if(NOT F_NAME OR NOT F_SOURCES)
    message(FATAL_ERROR "hk_add_fuzz_target needs NAME and SOURCES")
  endif()
  if(F_CORPUS)
    get_filename_component(corpus ${F_CORPUS} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
  else()
    set(corpus ${HK_FUZZ_DIR}/corpus/${F_NAME})
  endif()
  if(NOT IS_DIRECTORY ${corpus})
    message(FATAL_ERROR "hk_add_fuzz_target(${F_NAME}): corpus directory ${corpus} does not exist")
  endif()
  add_executable(${F_NAME}_replay ${F_SOURCES} ${HK_FUZZ_DIR}/replay_main.cc)
  target_link_libraries(${F_NAME}_replay PRIVATE hk ${F_LIBS})
  target_include_directories(${F_NAME}_replay PRIVATE ${PROJECT_SOURCE_DIR}/src)
  add_test(NAME ${F_NAME}_corpus COMMAND ${F_NAME}_replay ${corpus})
  set_tests_properties(${F_NAME}_corpus PROPERTIES LABELS fuzz TIMEOUT 300)
  if(HK_FUZZ_REAL)
    add_executable(${F_NAME} ${F_SOURCES})
    target_link_libraries(${F_NAME} PRIVATE hk ${F_LIBS})
    target_include_directories(${F_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_compile_options(${F_NAME} PRIVATE -fsanitize=fuzzer,address -fno-omit-frame-pointer)
    target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer,address)
  endif()
endfunction()
