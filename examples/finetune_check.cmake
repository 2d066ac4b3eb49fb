# CTest script for examples/finetune.cpp (run with cmake -P): makes the fine-tuning task with
# examples/data/make_classification.py (the pretraining task's features, other labels), then
# trains the new head for 3 epochs on top of the PyTorch-trained backbone and, for comparison,
# on top of a random frozen backbone: the pretrained one must load 4 tensors, replace the head
# and end clearly more accurate (transfer works), and both runs must finish; --epochs 1 trains;
# bad values, a missing --from and labels beyond --classes are refused leaving no run directory.
#   -DEXE=<finetune> -DPYTHON=<python3 with numpy> -DSCRIPT=<make_classification.py>
#   -DPRETRAINED=<pretrained.safetensors> -DOUT=<dir>
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --out "${OUT}/data" --head-seed 200 --classes 4
                        --train 4096 --val 1024 RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_classification.py failed (${rc})")
endif()
function(final_accuracy out_var)
  execute_process(COMMAND "${EXE}" --data "${OUT}/data" --epochs 3 ${ARGN} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "finetune ${ARGN} -> ${rc}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "finetune ${ARGN} exited with ${rc}")
  endif()
  string(REGEX MATCHALL "val accuracy [0-9.]+" lines "${out}")
  list(LENGTH lines n)
  if(NOT n EQUAL 3)
    message(FATAL_ERROR "expected 3 accuracy lines, got ${n}")
  endif()
  list(GET lines 2 last)
  string(REGEX MATCH "[0-9.]+" last "${last}")
  set(${out_var} "${last}" PARENT_SCOPE)
  set(${out_var}_log "${out}" PARENT_SCOPE)
endfunction()
final_accuracy(pretrained --from "${PRETRAINED}" --out "${OUT}/pretrained")
if(NOT pretrained_log MATCHES "loaded 4 tensors from .*new head: 2 tensors \\(4 classes\\)")
  message(FATAL_ERROR "the backbone was not loaded with a new head")
endif()
final_accuracy(random --from= --out "${OUT}/random")  # an empty --from: random init
# math() is integer-only: compare in hundredths of a percent.
string(REPLACE "." "" p "${pretrained}")
string(REPLACE "." "" r "${random}")
math(EXPR gap "${p} - ${r}")
if(gap LESS 500)
  message(FATAL_ERROR "pretrained backbone ${pretrained}% vs random ${random}%: no transfer")
endif()
# One epoch is a run (its warmup: a tenth of it).
execute_process(COMMAND "${EXE}" --data "${OUT}/data" --epochs 1 --from "${PRETRAINED}"
                        --out "${OUT}/one" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "val accuracy")
  message(FATAL_ERROR "--epochs 1: exit ${rc}\n${out}${err}")
endif()
# Refused starts name the flag and leave no run directory: a bad value, a --from file that does
# not exist, labels (0-3) beyond --classes 2.
foreach(case "--classes|1|--classes is '1', not a value >= 2" "--epochs|0|--epochs is '0'"
        "--lr|0|--lr is '0', not a value > 0" "--from|${OUT}/missing.safetensors|missing"
        "--classes|2|out of range")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 flag)
  list(GET case 1 value)
  list(GET case 2 want)
  set(from --from=)  # random weights, unless the case is --from
  if(flag STREQUAL "--from")
    set(from)
  endif()
  execute_process(COMMAND "${EXE}" --data "${OUT}/data" --out "${OUT}/refused" ${from} ${flag}
                          ${value} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "finetune ${flag} ${value} -> ${rc}\n${out}${err}")
  string(FIND "${err}" "${want}" at)
  if(NOT rc EQUAL 1 OR at EQUAL -1 OR EXISTS "${OUT}/refused")
    message(FATAL_ERROR "${flag} ${value}: want exit 1, '${want}' and no ${OUT}/refused")
  endif()
endforeach()
