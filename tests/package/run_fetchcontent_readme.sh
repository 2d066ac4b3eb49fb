#!/usr/bin/env bash
# The README's FetchContent snippet, run exactly as a user runs it: the working tree is committed
# into a throwaway git repository (branch main), the snippet's <url-of-this-repo> becomes that
# repository's file:// URL, and the snippet is the consumer's whole CMakeLists.txt; the consumer
# program is tests/package/consumer/main.cpp as main.cpp. Then run_cmake_consumer.sh configures,
# builds and runs it (and checks that trainkit::trainkit links no backend library).
#   run_fetchcontent_readme.sh SOURCE_DIR CONSUMER_DIR WORK_DIR [cmake args...]
set -euo pipefail
source_dir=$1 consumer_dir=$2 work=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work/repo" "$work/app"

# The repository a user would fetch: every tracked and untracked-but-not-ignored file as it is.
(cd "$source_dir" && git ls-files -co --exclude-standard -z) |
  while IFS= read -r -d '' f; do
    if [[ -f $source_dir/$f ]]; then
      mkdir -p "$work/repo/$(dirname "$f")"
      cp -p "$source_dir/$f" "$work/repo/$f"
    fi
  done
git -C "$work/repo" init -q -b main
git -C "$work/repo" add -A
git -C "$work/repo" -c user.name=trainkit -c user.email=trainkit@localhost \
  commit -q -m "snapshot for the FetchContent test"

python3 - "$source_dir/README.md" "$work/app/CMakeLists.txt" "file://$work/repo" <<'PY'
import re, sys
readme, out, url = sys.argv[1:4]
blocks = re.findall(r"```cmake\n(.*?)```", open(readme, encoding="utf-8").read(), re.S)
snippet = next((b for b in blocks if "FetchContent_Declare" in b), None)
if snippet is None:
    sys.exit("run_fetchcontent_readme.sh: README.md has no ```cmake block with FetchContent_Declare")
if "<url-of-this-repo>" not in snippet:
    sys.exit("run_fetchcontent_readme.sh: the README snippet no longer names <url-of-this-repo>")
open(out, "w", encoding="utf-8").write(snippet.replace("<url-of-this-repo>", url))
PY
cp "$consumer_dir/main.cpp" "$work/app/main.cpp"
echo "+ consumer CMakeLists.txt (the README snippet):"
cat "$work/app/CMakeLists.txt"
bash "$here/run_cmake_consumer.sh" "$work/app" "$work/build" "$@"
