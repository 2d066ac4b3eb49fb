# CTest script for examples/mlp_classifier.cpp (run with cmake -P): makes a small dataset with
# examples/data/make_classification.py, trains 3 epochs, checks that the accuracy rose above
# chance and ends where a second identical run ends (same lines, bit-identical training), that a
# rerun of the finished run restores it and trains nothing, and that a resume asking for another
# run setting (--epochs) is refused naming it; that --epochs 1 trains, bad flag values are refused
# naming the flag, and labels >= 10 are an error.
#   -DEXE=<mlp_classifier> -DPYTHON=<python3 with numpy> -DSCRIPT=<make_classification.py> -DOUT=<dir>
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --out "${OUT}/data" --train 2048 --val 512
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_classification.py failed (${rc})")
endif()
function(run expected_rc out_var)
  execute_process(COMMAND "${EXE}" --data "${OUT}/data" ${ARGN} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "mlp_classifier ${ARGN} -> ${rc}\n${out}${err}")
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "mlp_classifier ${ARGN} exited with ${rc}, expected ${expected_rc}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()
function(accuracies text out_var)
  string(REGEX MATCHALL "val accuracy [0-9.]+%" lines "${text}")
  set(${out_var} "${lines}" PARENT_SCOPE)
endfunction()

run(0 first --out "${OUT}/a" --epochs 3 --hidden 64)
accuracies("${first}" a)
list(LENGTH a n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected one accuracy line per epoch (3), got ${n}")
endif()
list(GET a 2 last)
string(REGEX MATCH "[0-9.]+" last "${last}")
if(last LESS 30)
  message(FATAL_ERROR "validation accuracy ${last}% after 3 epochs (chance is 10%)")
endif()
run(0 second --out "${OUT}/b" --epochs 3 --hidden 64)
accuracies("${second}" b)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "two identical runs differ: '${a}' vs '${b}'")
endif()
run(0 again --out "${OUT}/a" --epochs 3 --hidden 64)
accuracies("${again}" c)
if(c)
  message(FATAL_ERROR "rerunning a finished run trained again: '${c}'")
endif()
run(1 refused --out "${OUT}/a" --epochs 4)
if(NOT refused MATCHES "--epochs: the run has 3, the command line 4")
  message(FATAL_ERROR "a resume with another --epochs was not refused with the difference")
endif()
# One epoch is a run (its warmup: a tenth of it).
run(0 one --out "${OUT}/e" --epochs 1 --hidden 64)
accuracies("${one}" e)
list(LENGTH e n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "--epochs 1: expected one accuracy line, got ${n}")
endif()
# Bad values are refused naming the flag.
foreach(case "--epochs|0|--epochs is '0', not a value >= 1" "--hidden|0|--hidden is '0'"
        "--hidden|100000000000|--hidden is '100000000000', not a value <= "
        "--lr|-1|--lr is '-1', not a value > 0")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 flag)
  list(GET case 1 value)
  list(GET case 2 want)
  run(1 refused --out "${OUT}/refused" ${flag} ${value})
  string(FIND "${refused}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${flag} ${value}: want the error '${want}'")
  endif()
endforeach()
# Labels beyond the 10 classes: the first step fails naming the range.
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --out "${OUT}/data20" --classes 20 --train 256
                        --val 64 RESULT_VARIABLE rc)
execute_process(COMMAND "${EXE}" --data "${OUT}/data20" --out "${OUT}/labels" RESULT_VARIABLE rc
                ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "out of range \\[0, 10\\)")
  message(FATAL_ERROR "20-class labels: exit ${rc} (want 1), '${err}'")
endif()
