# CTest script for examples/finetune.cpp (run with cmake -P): makes the fine-tuning task with
# examples/data/make_classification.py (the pretraining task's features, other labels), then
# trains the new head for 3 epochs on top of the PyTorch-trained backbone and, for comparison,
# on top of a random frozen backbone: the pretrained one must load 4 tensors, replace the head
# and end clearly more accurate (transfer works), and both runs must finish.
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
