# Command-line checks of train_gpt (registered by examples/CMakeLists.txt):
#   cmake -DEXE=<train_gpt> -DOUT=<scratch dir> -DCHECK=<name> [-DPYTHON=<python>] -P this file
# CHECK=flags:   every bad flag value exits 1 naming its flag, and leaves no run directory behind
#                (also with --resume of a directory that does not exist yet, and with --ranks 2);
#                an --out under a file is refused naming --out; --sample-chars 0 prints no sample.
# CHECK=flush:   stdout is line-buffered: a run killed with SIGKILL early has its first lines in
#                the log file.
# CHECK=resume:  a run resumed twice from the same checkpoint keeps metrics.jsonl whole: each
#                step once, the initial validation loss at step 0, nothing lost or doubled; step
#                numbers agree between console, metrics, checkpoints (and TensorBoard, when
#                PYTHON can import tensorboard); MFU says where its peak came from.
# CHECK=init_from: --init-from FIXTURE (weights saved by PyTorch's safetensors) loads every tensor
#                and changes the initial validation loss (FIXTURE's _bf16 twin loads rounded to F32
#                and starts at the same loss to two decimals); a model of other sizes is refused with
#                the tensor and both shapes named, and a resumed run keeps its checkpoint's weights.
# CHECK=ranks:   data parallel: --ranks 2 --batch 4 ends within 8 ulps (1e-6) of --ranks 1
#                --batch 8 (the same sequences per step, summed in another order); a 2-rank run
#                cut in two and resumed ends on the same loss bits as a straight one; a resume
#                with another number of ranks is refused saying so, and one without --ranks
#                continues with the run's number; with MPIEXEC, `mpirun -np 2`
#                (MpiComm) ends within 8 ulps of --ranks 2 (ThreadComm).
cmake_minimum_required(VERSION 3.20)
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
set(tiny --threads 1 --layers 1 --dim 32 --heads 2 --seq 16 --batch 4 --eval-batches 1
         --sample-chars 8)

if(CHECK STREQUAL "flags")
  set(cases
      "--steps|-5" "--steps|0" "--batch|0" "--seq|1" "--layers|0" "--dim|-1" "--heads|0"
      "--heads|3" "--lr|-1" "--lr|nan" "--dropout|1" "--weight-decay|-0.5" "--grad-clip|-1"
      "--warmup|-2" "--warmup|500" "--decay-steps|1" "--log-every|0" "--eval-every|0"
      "--eval-batches|0" "--ckpt-every|0" "--keep|-1" "--sample-chars|-3" "--temperature|-1"
      "--peak-tflops|-2" "--threads|-4" "--data|${OUT}/no_such_corpus" "--steps|five"
      "--lr|1e-3x" "--ranks|4294967296" "--threads|2147483648" "--keep|4294967296"
      "--eval-batches|4611686018427387904" "--sample-chars|9223372036854775807"
      "--dim|1073741824" "--layers|2147483648" "--vocab|2147483648" "--dim|65536"
      "--batch|10000000" "--data|/dev/zero" "--peak-tflops|1e300")
  # Each also with --resume of a directory that does not exist yet (a fresh run).
  foreach(case IN LISTS cases)
    foreach(resume IN ITEMS "" "--resume")
      string(REPLACE "|" ";" pair "${case}")
      list(GET pair 0 flag)
      list(GET pair 1 value)
      execute_process(COMMAND "${EXE}" ${flag} ${value} ${resume} --out "${OUT}/run"
                      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
      if(NOT rc EQUAL 1)
        message(FATAL_ERROR "train_gpt ${flag} ${value} ${resume}: exit ${rc}, want 1\n${out}${err}")
      endif()
      string(FIND "${err}" "${flag}" at)
      if(at EQUAL -1)
        message(FATAL_ERROR "train_gpt ${flag} ${value} ${resume}: the error does not name ${flag}: ${err}")
      endif()
      if(err MATCHES "\\.(hpp|cpp):[0-9]+")
        message(FATAL_ERROR "train_gpt ${flag} ${value} ${resume}: the error shows a source location: ${err}")
      endif()
      if(EXISTS "${OUT}/run")
        message(FATAL_ERROR "train_gpt ${flag} ${value} ${resume}: left ${OUT}/run behind")
      endif()
      message(STATUS "${flag} ${value} ${resume}: ${err}")
    endforeach()
  endforeach()
  # A refused --ranks start leaves no run directory either, whichever rank created it first
  # (tried 10 times: the ranks race).
  string(REPEAT "hello world, this is a tiny corpus of text. " 10 small)
  file(WRITE "${OUT}/small.txt" "${small}")
  foreach(i RANGE 1 10)
    execute_process(COMMAND "${EXE}" --threads 2 --ranks 2 --layers 1 --dim 32 --heads 2 --seq 16
                            --batch 300 --out "${OUT}/run" --data "${OUT}/small.txt"
                    RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 1 OR NOT err MATCHES "--batch 300 on each of 2 ranks is more than the corpus"
       OR EXISTS "${OUT}/run")
      message(FATAL_ERROR "--ranks 2 --batch 300 (try ${i}): exit ${rc}, want 1, no ${OUT}/run: ${err}")
    endif()
  endforeach()
  # An --out that is, or lies under, a file is refused naming --out (not the checkpointer).
  file(WRITE "${OUT}/a_file" "")
  foreach(dir "${OUT}/a_file" "${OUT}/a_file/run")
    execute_process(COMMAND "${EXE}" ${tiny} --steps 2 --out "${dir}" RESULT_VARIABLE rc
                    ERROR_VARIABLE err)
    if(NOT rc EQUAL 1 OR NOT err MATCHES "--out '[^']*': '[^']*a_file' is a file, not a directory")
      message(FATAL_ERROR "--out ${dir}: exit ${rc}, want 1 naming --out: ${err}")
    endif()
  endforeach()
  # --sample-chars 0 prints no sample block (it printed the prompt alone).
  list(REMOVE_ITEM tiny --sample-chars 8)
  execute_process(COMMAND "${EXE}" ${tiny} --sample-chars 0 --steps 2 --out "${OUT}/nosample"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR out MATCHES "---- sample")
    message(FATAL_ERROR "--sample-chars 0: exit ${rc}, want 0 and no sample: ${out}${err}")
  endif()

elseif(CHECK STREQUAL "flush")
    # A model whose first validation pass takes a minute or more (2 TFLOP on one thread): nothing
  # else would flush stdout before it. The log must show the first lines within 15 s; then the
  # run is killed.
  set(script [=[
"$0" --steps 100000 --layers 12 --dim 512 --heads 8 --seq 512 --batch 4 --eval-batches 100000 \
     --threads 1 --out "$1/run" > "$1/log.txt" 2>&1 &
pid=$!
i=0
while [ $i -lt 150 ]; do
  grep -q "parameters" "$1/log.txt" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
  i=$((i + 1))
done
kill -9 $pid 2>/dev/null
wait $pid
exit 0
]=])
  execute_process(COMMAND sh -c "${script}" "${EXE}" "${OUT}" RESULT_VARIABLE rc)
  file(READ "${OUT}/log.txt" log)
  message(STATUS "log of the killed run:\n${log}")
  if(NOT log MATCHES "train_gpt: [0-9]+ parameters")
    message(FATAL_ERROR "the killed run's log lacks its first lines: stdout is not line-buffered")
  endif()

elseif(CHECK STREQUAL "resume")
  set(run "${OUT}/run")
  set(common ${tiny} --steps 20 --log-every 5 --eval-every 10 --ckpt-every 10 --keep 0
             --out "${run}")
  function(train)
    execute_process(COMMAND "${EXE}" ${common} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err)
    message(STATUS "train_gpt ${ARGN}\n${out}${err}")
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "train_gpt exited with ${rc}")
    endif()
    set(out "${out}" PARENT_SCOPE)
  endfunction()
  function(drop_checkpoint_20)  # as if the run had crashed before writing it
    file(GLOB newest LIST_DIRECTORIES true "${run}/ckpt/step_*20")
    if(NOT newest)
      message(FATAL_ERROR "no checkpoint of step 20 in ${run}/ckpt")
    endif()
    file(REMOVE_RECURSE ${newest})
  endfunction()
  train()
  foreach(want "step 10: train loss" "step 20: train loss" "[trainkit] step 5/20 |"
          "[trainkit] step 20/20 |" "(measured: FMA rate of")
    string(FIND "${out}" "${want}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the first run's output lacks '${want}'")
    endif()
  endforeach()
  file(GLOB ck10 LIST_DIRECTORIES true "${run}/ckpt/step_*10")
  if(NOT ck10)
    message(FATAL_ERROR "no checkpoint of step 10: checkpoints and 'step N' lines disagree")
  endif()
  drop_checkpoint_20()
  # Event file names carry whole seconds and TensorBoard reads them in name order.
  execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
  train(--resume)
  if(NOT out MATCHES "resumed from .*step 10")
    message(FATAL_ERROR "the second run did not resume from step 10")
  endif()
  drop_checkpoint_20()
  execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
  train(--resume)
  if(NOT out MATCHES "resumed from .*step 10")
    message(FATAL_ERROR "the third run did not resume from step 10")
  endif()

  # A resume with nothing left to train, or on another corpus, is refused before it writes.
  function(refused want)
    execute_process(COMMAND "${EXE}" ${tiny} --out "${run}" ${ARGN} RESULT_VARIABLE rc
                    OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(REGEX REPLACE "[ \n]+" " " err "${err}")
    if(NOT rc EQUAL 1 OR NOT err MATCHES "${want}")
      message(FATAL_ERROR "train_gpt ${ARGN}: exit ${rc}, want 1 and '${want}':\n${out}${err}")
    endif()
  endfunction()
  refused("is at step 20, not before --steps 20" --resume --steps 20)
  # The validation loss picks the best checkpoint: its windows stay those of the run.
  set(other_eval ${tiny})
  list(FIND other_eval --eval-batches at)
  math(EXPR value_at "${at} + 1")
  list(REMOVE_AT other_eval ${value_at} ${at})
  execute_process(COMMAND "${EXE}" ${other_eval} --eval-batches 2 --out "${run}" --resume --steps 30
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "--eval-batches: the run has 1, the command line 2")
    message(FATAL_ERROR "a resume with another --eval-batches: exit ${rc}, want 1:\n${out}${err}")
  endif()
  string(REPEAT "Some other text, a corpus of its own.\n" 100 other)
  file(WRITE "${OUT}/other.txt" "${other}")
  refused("is not the corpus this run was trained on" --resume --steps 30
          --data "${OUT}/other.txt")

  file(GLOB extra "${run}/metrics*")
  list(LENGTH extra n_files)
  if(NOT n_files EQUAL 1)
    message(FATAL_ERROR "want metrics.jsonl alone, found: ${extra}")
  endif()
  file(STRINGS "${run}/metrics.jsonl" lines)
  set(summaries "")
  set(vals "")
  set(previous -1)
  foreach(line IN LISTS lines)
    string(JSON step GET "${line}" step)
    if(step LESS previous)
      message(FATAL_ERROR "metrics.jsonl goes back from step ${previous} to ${step}:\n${line}")
    endif()
    set(previous ${step})
    string(JSON has_steps ERROR_VARIABLE no_steps GET "${line}" steps)
    if(no_steps)
      list(APPEND vals ${step})
    else()
      list(APPEND summaries ${step})
    endif()
  endforeach()
  if(NOT summaries STREQUAL "5;10;15;20" OR NOT vals STREQUAL "0;10;20")
    message(FATAL_ERROR "metrics.jsonl: summaries at steps '${summaries}' (want 5;10;15;20), "
                        "validation losses at '${vals}' (want 0;10;20)")
  endif()

  if(PYTHON)
    execute_process(COMMAND "${PYTHON}" -c "import tensorboard" RESULT_VARIABLE no_tb
                    OUTPUT_QUIET ERROR_QUIET)
    if(no_tb EQUAL 0)
      set(check [=[
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
def steps(tag):
    return [e.step for e in acc.Scalars(tag)]
problems = []
if steps("train/loss") != list(range(1, 21)):
    problems.append("train/loss at steps %s, want 1..20 once each" % steps("train/loss"))
if steps("val/loss") != [0, 10, 20]:
    problems.append("val/loss at steps %s, want [0, 10, 20]" % steps("val/loss"))
if steps("perf/step_time_ms") != [5, 10, 15, 20]:
    problems.append("summaries at steps %s, want [5, 10, 15, 20]" % steps("perf/step_time_ms"))
print("\n".join(problems) or "tensorboard: OK")
sys.exit(1 if problems else 0)
]=])
      execute_process(COMMAND "${PYTHON}" -c "${check}" "${run}/tb" RESULT_VARIABLE rc
                      OUTPUT_VARIABLE out ERROR_VARIABLE err)
      message(STATUS "${out}${err}")
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "TensorBoard does not show each step once")
      endif()
    else()
      message(STATUS "${PYTHON} cannot import tensorboard: TensorBoard view not checked")
    endif()
  endif()
elseif(CHECK STREQUAL "init_from")
  function(run_tiny name)
    execute_process(COMMAND "${EXE}" ${tiny} --out "${OUT}/${name}" ${ARGN}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    message(STATUS "train_gpt ${ARGN} -> ${rc}\n${out}${err}")
    set(rc ${rc} PARENT_SCOPE)
    set(log "${out}${err}" PARENT_SCOPE)
    string(REGEX MATCH "step 0: val/loss ([0-9.]+)" _ "${out}")
    set(first_loss "${CMAKE_MATCH_1}" PARENT_SCOPE)  # the initial validation loss
  endfunction()
  run_tiny(random --steps 2)
  set(random_loss "${first_loss}")
  run_tiny(loaded --init-from "${FIXTURE}" --steps 2)
  if(NOT rc EQUAL 0 OR NOT log MATCHES "--init-from [^\n]*: loaded 17 tensors \\(0 rounded to F32\\), 0 of the file unused")
    message(FATAL_ERROR "--init-from did not load the 17 tensors of ${FIXTURE}")
  endif()
  if(random_loss STREQUAL "" OR first_loss STREQUAL random_loss)
    message(FATAL_ERROR "the initial val loss is ${first_loss} with and without --init-from")
  endif()
  # The same weights saved in BF16 (FIXTURE's _bf16 twin) load rounded to F32: every tensor is
  # counted as rounded, and the initial val loss agrees with the F32 file's to two decimals.
  string(REPLACE ".safetensors" "_bf16.safetensors" fixture_bf16 "${FIXTURE}")
  set(f32_loss "${first_loss}")
  run_tiny(bf16 --init-from "${fixture_bf16}" --steps 2)
  if(NOT rc EQUAL 0 OR NOT log MATCHES "loaded 17 tensors \\(17 rounded to F32\\), 0 of the file unused")
    message(FATAL_ERROR "--init-from did not load the 17 BF16 tensors of ${fixture_bf16}")
  endif()
  string(SUBSTRING "${first_loss}" 0 4 bf16_head)
  string(SUBSTRING "${f32_loss}" 0 4 f32_head)
  if(first_loss STREQUAL "" OR NOT bf16_head STREQUAL f32_head)
    message(FATAL_ERROR "BF16 weights start at val loss ${first_loss}, F32 at ${f32_loss}")
  endif()
  run_tiny(loaded --init-from "${FIXTURE}" --resume --steps 3)
  if(NOT rc EQUAL 0 OR log MATCHES "loaded 17 tensors" OR NOT log MATCHES "resumed from")
    message(FATAL_ERROR "a resumed run must keep its checkpoint's weights")
  endif()
  execute_process(COMMAND "${EXE}" --threads 1 --layers 1 --dim 64 --heads 2 --seq 16 --steps 2
                          --out "${OUT}/wide" --init-from "${FIXTURE}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE log)
  if(NOT rc EQUAL 1 OR NOT log MATCHES "'transformer.wte.weight' has shape \\[256, 32\\] in the file but \\[256, 64\\]")
    message(FATAL_ERROR "a model of other sizes must be refused naming the tensor and shapes")
  endif()
  # A run that fails before its first step leaves no run directory behind (the corrected
  # command then starts fresh, not as an unfinished run); one that existed before stays.
  if(EXISTS "${OUT}/wide")
    message(FATAL_ERROR "the refused run left its directory ${OUT}/wide behind")
  endif()
  # A tied model takes its head from lm_head.weight or transformer.wte.weight, or both when they
  # are equal: FIXTURE's two different tensors are an untied model's; a tied 2-layer model's
  # weights do not load into 1 layer.
  run_tiny(tied --tie-weights --init-from "${FIXTURE}" --steps 1)
  if(NOT rc EQUAL 1 OR NOT log MATCHES "'lm_head.weight' and 'transformer.wte.weight' differ in the file, but the model ties them")
    message(FATAL_ERROR "a tied model must refuse a file whose head and embedding differ")
  endif()
  execute_process(COMMAND "${EXE}" --threads 1 --layers 2 --dim 32 --heads 2 --seq 16 --batch 4
                          --eval-batches 1 --sample-chars 8 --steps 1 --ckpt-every 1 --tie-weights
                          --out "${OUT}/two_layers" RESULT_VARIABLE rc OUTPUT_QUIET)
  file(GLOB two_layers "${OUT}/two_layers/ckpt/step_*1/model.safetensors")
  run_tiny(tied --tie-weights --init-from "${two_layers}" --steps 1)
  if(NOT rc EQUAL 1 OR NOT log MATCHES "unexpected \\(in the file, not in the model\\): 'transformer.h.1.")
    message(FATAL_ERROR "a tied 1-layer model must refuse a 2-layer model's weights")
  endif()
  run_tiny(missing --init-from "${OUT}/no_such.safetensors" --steps 2)
  if(NOT rc EQUAL 1 OR NOT log MATCHES "--init-from: [^\n]*no_such.safetensors")
    message(FATAL_ERROR "a missing --init-from file must be an error naming the flag and file")
  endif()
  if(EXISTS "${OUT}/missing" OR EXISTS "${OUT}/tied")
    message(FATAL_ERROR "a refused --init-from left its run directory behind")
  endif()
  file(MAKE_DIRECTORY "${OUT}/kept")
  file(WRITE "${OUT}/kept/notes.txt" "mine")
  run_tiny(kept --init-from "${OUT}/no_such.safetensors" --steps 2)
  if(NOT rc EQUAL 1 OR NOT EXISTS "${OUT}/kept/notes.txt")
    message(FATAL_ERROR "a failed start must leave a directory it did not create as it was")
  endif()
elseif(CHECK STREQUAL "ranks")
  # The last step's loss bits printed by a run (fatal unless it exited 0).
  function(run_dp result)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    message(STATUS "${ARGN} -> ${rc}\n${out}${err}")
    if(NOT rc EQUAL 0 OR NOT out MATCHES "last (0x[0-9a-f]+)")
      message(FATAL_ERROR "the run exited with ${rc} or printed no final loss")
    endif()
    set(${result} "${CMAKE_MATCH_1}" PARENT_SCOPE)
    set(log "${out}" PARENT_SCOPE)
  endfunction()
  # Two positive floats' distance in ulps: the difference of their bit patterns.
  function(expect_close a b what)
    math(EXPR d "${a} - ${b}")
    if(d LESS -8 OR d GREATER 8)
      message(FATAL_ERROR "${what}: last losses ${a} and ${b} are ${d} ulps apart")
    endif()
  endfunction()
  set(base --layers 1 --dim 32 --heads 2 --seq 16 --eval-batches 1 --sample-chars 8
           --decay-steps 12 --log-every 6 --eval-every 6 --ckpt-every 6)
  set(dp ${base} --steps 12)
  run_dp(two "${EXE}" ${dp} --ranks 2 --batch 4 --out "${OUT}/two")
  if(NOT log MATCHES "2 ranks \\(ThreadComm\\) x 1 threads")
    message(FATAL_ERROR "--ranks 2 did not say it runs two ranks")
  endif()
  run_dp(one "${EXE}" ${dp} --batch 8 --out "${OUT}/one")
  expect_close(${two} ${one} "--ranks 2 --batch 4 vs --ranks 1 --batch 8")
  set(cut ${base})
  run_dp(half "${EXE}" ${cut} --steps 6 --ranks 2 --batch 4 --out "${OUT}/cut")
  # --ranks is a setting of the run: the resume leaves it out and still runs 2 ranks.
  run_dp(resumed "${EXE}" ${cut} --steps 12 --batch 4 --out "${OUT}/cut" --resume)
  if(NOT log MATCHES "resumed from [^\n]*step 6" OR NOT resumed STREQUAL two)
    message(FATAL_ERROR "the resumed 2-rank run ends on ${resumed}, the straight one on ${two}")
  endif()
  execute_process(COMMAND "${EXE}" ${cut} --steps 18 --ranks 1 --batch 4 --out "${OUT}/cut"
                          --resume RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX REPLACE "[ \n]+" " " err "${err}")
  if(NOT rc EQUAL 1 OR NOT err MATCHES "--ranks: the run has 2, the command line 1")
    message(FATAL_ERROR "a resume with another --ranks must be refused naming it:\n${err}")
  endif()
  if(MPIEXEC)
    run_dp(mpi "${MPIEXEC}" -np 2 "${EXE}" ${dp} --batch 4 --threads 1 --out "${OUT}/mpi")
    if(NOT log MATCHES "2 ranks \\(MpiComm\\)")
      message(FATAL_ERROR "mpirun -np 2 did not run two MPI ranks")
    endif()
    expect_close(${mpi} ${two} "mpirun -np 2 vs --ranks 2")
  else()
    message(STATUS "no mpirun: the MPI run is not checked")
  endif()
else()
  message(FATAL_ERROR "unknown CHECK '${CHECK}'")
endif()
