# CTest script for examples/hpsearch.cpp (run with cmake -P): makes a small dataset with
# examples/data/make_classification.py, starts an ASHA search over examples/mlp_classifier in the
# background and kills it with SIGKILL once one trial has finished while others run, then runs the
# same command again. The rerun must continue (not start over) and finish with every trial done
# once: each trial in results.json exactly once, completed or stopped, the interrupted ones started
# once more, and every trial's metrics.jsonl holding each epoch once. A third run with another
# --seed must be refused, naming the difference. First, --trials, --parallel and --eta beyond an
# int are refused naming the flag.
#   -DEXE=<hpsearch> -DMLP=<mlp_classifier> -DPYTHON=<python3 with numpy>
#   -DSCRIPT=<make_classification.py> -DOUT=<dir>
file(REMOVE_RECURSE "${OUT}")
# 0. Counts beyond an int are refused naming the flag (they were cut to 32 bits: --trials
#    4294967297 ran one trial).
foreach(case "--trials|4294967297" "--parallel|4294967297" "--eta|4294967298")
  string(REPLACE "|" ";" case "${case}")
  execute_process(COMMAND "${EXE}" --dir "${OUT}/bad" ${case} --space "lr=uniform(0,1)" --
                          "${MLP}" --out "{dir}" --lr "{lr}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  list(GET case 0 flag)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "${flag} is '[0-9]+', not a value <= " OR EXISTS "${OUT}/bad")
    message(FATAL_ERROR "hpsearch ${case}: exit ${rc}, want 1 naming ${flag}: ${out}${err}")
  endif()
endforeach()
# A search whose every trial fails (here: no data) exits 1 saying that no trial reported.
execute_process(COMMAND "${EXE}" --dir "${OUT}/failing" --trials 2 --max-budget 1 --min-budget 1
                        --tensorboard=false --space "lr=uniform(0.001,0.01)" -- "${MLP}"
                        --data "${OUT}/no_data" --out "{dir}" --lr "{lr}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "hpsearch: no trial reported val_accuracy")
  message(FATAL_ERROR "a search of failing trials: exit ${rc}, want 1: ${out}${err}")
endif()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" --out "${OUT}/data" --train 16384 --val 1024
                        --features 256
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_classification.py failed (${rc})")
endif()
set(search --dir "${OUT}/search" --trials 6 --parallel 2 --strategy asha --metric val_accuracy
           --mode max --max-budget 4 --eta 2
           --space "lr=loguniform(1e-3,3e-2) hidden=choice(16,32,64)"
           -- "${MLP}" --data "${OUT}/data" --out "{dir}" --epochs 4 --lr "{lr}"
           --hidden "{hidden}" --seed "{seed}")
set(state "${OUT}/search/search.json")

# 1. In the background; SIGKILL once search.json shows a finished trial and a running one.
execute_process(
  COMMAND sh -c [=[
log="$1"; state="$2"; shift 2
"$@" > "$log" 2>&1 &
pid=$!
i=0
while [ $i -lt 1200 ] && kill -0 $pid 2>/dev/null; do
  if grep -q '"status": "\(completed\|stopped\)"' "$state" 2>/dev/null &&
     grep -q '"status": "running"' "$state" 2>/dev/null; then
    kill -9 $pid
    wait $pid
    echo "killed"
    exit 0
  fi
  sleep 0.05
  i=$((i + 1))
done
kill -9 $pid 2>/dev/null
echo "no trial finished while others ran"
exit 1
]=] sh "${OUT}/first.log" "${state}" "${EXE}" ${search}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out)
file(READ "${OUT}/first.log" first_log)
message(STATUS "first run (${rc}): ${out}\n${first_log}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "killed")
  message(FATAL_ERROR "the first search was not killed while trials ran")
endif()
if(EXISTS "${OUT}/search/results.json")
  message(FATAL_ERROR "the first search finished before it was killed; nothing was tested")
endif()
file(READ "${state}" killed_state)
string(JSON n LENGTH "${killed_state}" trials)
math(EXPR last "${n} - 1")
set(was_running "")
foreach(i RANGE ${last})
  string(JSON status GET "${killed_state}" trials ${i} status)
  if(status STREQUAL "running")
    list(APPEND was_running ${i})
  endif()
endforeach()
message(STATUS "running when killed: ${was_running}")

# 2. The same command again continues the search to its end.
execute_process(COMMAND "${EXE}" ${search} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message(STATUS "second run (${rc}):\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the continued search exited with ${rc}")
endif()
if(NOT out MATCHES "search: continuing [^\n]*: [0-9]+ of 6 trials finished, [1-9][0-9]* to restart")
  message(FATAL_ERROR "the second run did not say that it continues the search")
endif()
if(NOT out MATCHES "hpsearch: best trial [0-9]+: val_accuracy = ")
  message(FATAL_ERROR "the second run printed no best trial")
endif()
file(READ "${OUT}/search/results.json" results)
string(JSON n LENGTH "${results}" trials)
if(NOT n EQUAL 6)
  message(FATAL_ERROR "results.json holds ${n} trials, not 6")
endif()
set(seen "")
foreach(i RANGE 5)
  string(JSON id GET "${results}" trials ${i} trial)
  string(JSON status GET "${results}" trials ${i} status)
  string(JSON budget GET "${results}" trials ${i} budget)
  string(JSON starts GET "${results}" trials ${i} starts)
  list(APPEND seen ${id})
  if(NOT status MATCHES "^(completed|stopped)$")
    message(FATAL_ERROR "trial ${id} ended ${status}")
  endif()
  list(FIND was_running ${id} restarted)
  if(restarted GREATER -1)
    set(want_starts 2)
    # On Linux the killed search's trials got SIGTERM (they save a checkpoint) and the rerun's
    # resume from it; a trial killed before its loop started begins again instead.
    string(JSON dir GET "${results}" trials ${i} dir)
    file(READ "${dir}/stdout.log" trial_log)
    if(trial_log MATCHES "train::Loop: resumed from [^\n]*")
      message(STATUS "trial ${id}: ${CMAKE_MATCH_0}")
    endif()
  else()
    set(want_starts 1)
  endif()
  if(NOT starts EQUAL want_starts)
    message(FATAL_ERROR "trial ${id} was started ${starts} times, expected ${want_starts}")
  endif()
  # Each epoch's evaluation once in the trial's metrics.jsonl (a resumed run drops what the
  # killed one logged past its checkpoint), and at least as many as the budget reached.
  string(JSON dir GET "${results}" trials ${i} dir)
  file(STRINGS "${dir}/metrics.jsonl" lines REGEX "val_accuracy")
  set(steps "")
  foreach(line IN LISTS lines)
    string(JSON step GET "${line}" step)
    list(FIND steps ${step} dup)
    if(dup GREATER -1)
      message(FATAL_ERROR "trial ${id}'s metrics.jsonl holds step ${step} twice")
    endif()
    list(APPEND steps ${step})
  endforeach()
  list(LENGTH steps evals)
  if(evals LESS budget)
    message(FATAL_ERROR "trial ${id} reached budget ${budget} with ${evals} evaluations")
  endif()
endforeach()
list(SORT seen)
list(REMOVE_DUPLICATES seen)
list(LENGTH seen distinct)
if(NOT distinct EQUAL 6)
  message(FATAL_ERROR "results.json does not list every trial once: ${seen}")
endif()

# 3. Another seed is another search: refused, naming the difference.
execute_process(COMMAND "${EXE}" --seed 1 ${search} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "seed: the search has '0', now '1'")
  message(FATAL_ERROR "a rerun with another --seed was not refused (${rc}):\n${out}${err}")
endif()
