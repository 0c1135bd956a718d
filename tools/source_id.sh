#!/usr/bin/env bash
# A fingerprint of the library's, tests' and benchmarks' sources in this tree: the GPU machine's
# copy of the tree carries a stale .git (its `git log` names the commit the session started at),
# so the runs record this instead, and `tools/source_id.sh` here at a commit says whether it was
# that tree.
cd "$(dirname "$0")/.."
find src include python/src python/gfd bench tests CMakeLists.txt -type f \
  \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
     -o -name 'CMakeLists.txt' \) -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12
