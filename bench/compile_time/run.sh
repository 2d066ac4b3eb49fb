#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench/compile_time: what including trainkit costs a translation unit. Compiles, with the flags
# the README gives (g++ -std=c++20 -O2, CPU tier), (1) a file that only includes the umbrella
# header and (2) the example trainers, each three times, and reports the least CPU time
# (user + sys of the compiler and its children) against the budgets. The last line is the ratio
# budget / measured of the umbrella (> 1: within budget).
set -euo pipefail
root=${TRAINKIT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cxx=${CXX:-g++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <trainkit/trainkit.hpp>\nint main() { return 0; }\n' > "$work/umbrella.cpp"

cpu_seconds() {  # cpu_seconds ARGS...: least user+sys CPU seconds of three runs of ARGS
  python3 - "$@" <<'PY'
import resource, subprocess, sys
best = None
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    best = t if best is None else min(best, t)
print(f"{best:.2f}")
PY
}

echo "compile_time: $cxx -std=c++20 -O2 -I include (CPU tier), least of 3; load: $(cut -d' ' -f1-3 /proc/loadavg)"
umbrella=$(cpu_seconds "$cxx" -std=c++20 -O2 -I "$root/include" -c "$work/umbrella.cpp" -o "$work/u.o")
printf '  %-34s %6s s CPU   budget %5s s\n' "#include <trainkit/trainkit.hpp>" "$umbrella" 3
for ex in mlp_classifier finetune train_gpt; do
  src="$root/examples/$ex.cpp"
  [[ -f $src ]] || continue
  t=$(cpu_seconds "$cxx" -std=c++20 -O2 -I "$root/include" "$src" -pthread -o "$work/$ex")
  budget=-
  [[ $ex == mlp_classifier ]] && budget=15
  printf '  %-34s %6s s CPU   budget %5s s   (%s lines)\n' "examples/$ex.cpp" "$t" "$budget" \
    "$(wc -l < "$src")"
done
python3 -c "import sys; print(f'compile_time: {3.0 / float(sys.argv[1]):.2f}x the umbrella budget (3 s CPU / {sys.argv[1]} s)')" "$umbrella"
