#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench/compile_time: what including trainkit costs a translation unit, on both build paths
# (docs/compile_time.md), with the README's flags (g++ -std=c++20 -O2, CPU tier), each compile run
# three times, least CPU time (user + sys of the compiler and its children) reported:
#   plain single header   the default, header-only: `g++ -std=c++20 -O2 -I include x.cpp`, every
#                         function body compiled in the TU (what copying single_include/ gives);
#   compiled part         what the CMake target with TRAINKIT_SEPARATE_COMPILATION=ON compiles
#                         per TU: -DTRAINKIT_SEPARATE_COMPILATION=1, the heavy bodies and the f32
#                         host GEMM taken from src/trainkit.cpp, which is compiled once (its own
#                         cost is printed too, and is not part of any TU's figure); an example's
#                         figure includes linking against it. The same again with the umbrella as
#                         a precompiled header (trainkit_precompile_headers), the PCH built once.
# Budgets: the umbrella 3 s, examples/mlp_classifier.cpp 15 s. The last line is the ratio
# budget / measured of the umbrella on the best path (> 1: within budget).
set -euo pipefail
root=${TRAINKIT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cxx=${CXX:-g++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <trainkit/trainkit.hpp>\nint main() { return 0; }\n' > "$work/umbrella.cpp"
std=(-std=c++20 -O2)
sep=(-DTRAINKIT_SEPARATE_COMPILATION=1)

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
row() {  # row LABEL SECONDS BUDGET [NOTE]
  printf '  %-44s %6s s CPU   budget %3s s   %s\n' "$1" "$2" "$3" "${4:-}"
}

echo "compile_time: $cxx ${std[*]} -I include (CPU tier), least of 3; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo " plain single header (header-only, the default):"
plain=$(cpu_seconds "$cxx" "${std[@]}" -I "$root/include" -c "$work/umbrella.cpp" -o "$work/u.o")
row "#include <trainkit/trainkit.hpp>" "$plain" 3
for ex in mlp_classifier finetune train_gpt; do
  src="$root/examples/$ex.cpp"
  [[ -f $src ]] || continue
  t=$(cpu_seconds "$cxx" "${std[@]}" -I "$root/include" "$src" -pthread -o "$work/$ex")
  budget=-
  [[ $ex == mlp_classifier ]] && budget=15
  row "examples/$ex.cpp" "$t" "$budget" "($(wc -l < "$src") lines)"
done

echo " compiled part (CMake TRAINKIT_SEPARATE_COMPILATION=ON: trainkit::compiled):"
lib=$(cpu_seconds "$cxx" "${std[@]}" -I "$root/include" -c "$root/src/trainkit.cpp" -o "$work/trainkit.o")
row "src/trainkit.cpp (once per build)" "$lib" -
separate=$(cpu_seconds "$cxx" "${std[@]}" "${sep[@]}" -I "$root/include" -c "$work/umbrella.cpp" \
  -o "$work/u.o")
row "#include <trainkit/trainkit.hpp>" "$separate" 3
mkdir -p "$work/pch/trainkit"
cp "$root/include/trainkit/trainkit.hpp" "$work/pch/trainkit/trainkit.hpp"
pch=$(cpu_seconds "$cxx" "${std[@]}" "${sep[@]}" -I "$root/include" -x c++-header \
  "$work/pch/trainkit/trainkit.hpp" -o "$work/pch/trainkit/trainkit.hpp.gch")
with_pch=$(cpu_seconds "$cxx" "${std[@]}" "${sep[@]}" -I "$work/pch" -I "$root/include" -c \
  "$work/umbrella.cpp" -o "$work/u.o")
row "  the same with the precompiled header" "$with_pch" 3 "(the PCH itself: $pch s, once)"
for ex in mlp_classifier finetune train_gpt; do
  src="$root/examples/$ex.cpp"
  [[ -f $src ]] || continue
  t=$(cpu_seconds "$cxx" "${std[@]}" "${sep[@]}" -I "$root/include" "$src" "$work/trainkit.o" \
    -pthread -o "$work/$ex")
  budget=-
  [[ $ex == mlp_classifier ]] && budget=15
  row "examples/$ex.cpp" "$t" "$budget"
done
python3 - "$plain" "$separate" "$with_pch" <<'PY'
import sys
plain, separate, pch = map(float, sys.argv[1:])
print(f"compile_time: {3.0 / pch:.2f}x the umbrella budget on the compiled-part path with a "
      f"precompiled header (3 s CPU / {pch} s; without the PCH {3.0 / separate:.2f}x, "
      f"plain single header {3.0 / plain:.2f}x)")
PY
