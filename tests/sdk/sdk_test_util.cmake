# sdk_test_util.cmake — helpers of the tests/sdk cmake -P scripts (run_sdk_test.cmake,
# run_install_test.cmake): run a step and stop the test with its output when it fails.

# Runs a command; on failure (or success when EXPECT_FAILURE) stops the test with its output.
# The output lands in `<out_var>`.
function(run step out_var)
  cmake_parse_arguments(R "EXPECT_FAILURE" "" "COMMAND" ${ARGN})
  execute_process(COMMAND ${R_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(R_EXPECT_FAILURE AND rc EQUAL 0)
    message(FATAL_ERROR "${step}: expected a failure, got exit 0\n${out}")
  elseif(NOT R_EXPECT_FAILURE AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${step}: failed (${rc})\n${out}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  message(STATUS "ok: ${step}")
endfunction()

function(expect_contains step text needle)
  string(FIND "${text}" "${needle}" at)
  if(at LESS 0)
    message(FATAL_ERROR "${step}: expected '${needle}' in:\n${text}")
  endif()
endfunction()

