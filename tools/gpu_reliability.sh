#!/usr/bin/env bash
# The reliability runs of docs/RELIABILITY.md that need the GPU, on an existing build-gpu: the
# long stress run (100000 requests, both directions, both rings) and compute-sanitizer memcheck
# and racecheck on the CUDA cases of the engine suite that exercise each kernel and path.
#   tools/gpu_reliability.sh LOGDIR     logs go to LOGDIR; one summary line per run on stdout
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: tools/gpu_reliability.sh LOGDIR}
mkdir -p "$LOG"
SECONDS=0
GFD_STRESS_REQUESTS=100000 timeout 200 build-gpu/tests/gfd_stress_test --gtest_filter='*Cuda' > "$LOG/stress_long.log" 2>&1
echo "== stress long: rc=$? (${SECONDS}s) $(grep -E '^stress' "$LOG/stress_long.log" | tr '\n' ' ')"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
PICK='*OneByte/Cuda*:*ScatteredDestinationsUseScatterKernel/Cuda*:*RandomSizesAndAlignments/Cuda*'
PICK="$PICK:*LargePinnedBlocksGoDirect/Cuda*:*WorkQueuedAfterOnTheStreamSeesTheData/Cuda*"
PICK="$PICK:*ConcurrentSubmittersWithTinyRing/Cuda*:*SmallPinnedTransfersCanTakeTheKernel/Cuda*"
PICK="$PICK:*CopyToHost*/Cuda*:*FoundBadLate*/Cuda*:*SwapOut*/Cuda*:*IssuingFromTheGatherThreadsWorksToo/Cuda*"
PICK="$PICK:*OneChunkTransfersLandWhoeverGathersThem/Cuda*"
for tool in memcheck racecheck; do
  SECONDS=0
  limit=120; [ $tool = racecheck ] && limit=70
  timeout $limit "$CS" --tool $tool --error-exitcode 3 build-gpu/tests/gfd_engine_test --gtest_filter="$PICK" \
    > "$LOG/sanitizer_$tool.log" 2>&1
  echo "== compute-sanitizer $tool: rc=$? (${SECONDS}s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests? ran|PASSED|FAILED' "$LOG/sanitizer_$tool.log" | tr '\n' ' ')"
done
