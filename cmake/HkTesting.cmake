# hk_add_test(NAME <name> SOURCES <files...> [LABELS <labels...>] [LIBS <libs...>])
# One GoogleTest executable registered with ctest. Label `gpu` marks tests that need a CUDA device;
# CI runs `ctest -LE gpu`. Tests see HK_SOURCE_DIR / HK_BINARY_DIR in their environment.
find_package(GTest REQUIRED)
function(hk_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE hk GTest::gtest GTest::gtest_main ${T_LIBS})
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES
    ENVIRONMENT "HK_SOURCE_DIR=${PROJECT_SOURCE_DIR};HK_BINARY_DIR=${PROJECT_BINARY_DIR}"
    TIMEOUT 600)
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
