# Runs one compile-fail test (see CMakeLists.txt): cmake -DCOMPILER=.. -DFLAGS=a|b -DSOURCE=..
# -DREGEX=.. -P check_compile_fail.cmake
string(REPLACE "|" ";" FLAGS "${FLAGS}")

execute_process(COMMAND "${COMPILER}" ${FLAGS} -DTRAINKIT_SHOULD_FAIL=0 "${SOURCE}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "control build (-DTRAINKIT_SHOULD_FAIL=0) of ${SOURCE} must compile but "
                      "failed; fix the test itself:\n${out}")
endif()

execute_process(COMMAND "${COMPILER}" ${FLAGS} -DTRAINKIT_SHOULD_FAIL=1 "${SOURCE}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled with -DTRAINKIT_SHOULD_FAIL=1 but must not: the misuse "
                      "it exercises is no longer rejected at compile time")
endif()
if(NOT out MATCHES "${REGEX}")
  message(FATAL_ERROR "${SOURCE} failed to compile, but not with the expected diagnostic "
                      "(regex: ${REGEX}):\n${out}")
endif()
message(STATUS "${SOURCE}: rejected as expected (matched '${REGEX}')")
