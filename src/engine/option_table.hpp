// The one list of engine options: name (the EngineOptions field), kind of value, GFD_* variable
// and a one-line description. EngineOptions::from_env, set, get and names are driven by it, and
// gfd_options_doc writes docs/options.md from it (defaults from EngineOptions{}), so that the
// code, the environment and the documentation cannot disagree about an option.
#pragma once

#include <span>

#include "gfd/options.hpp"

// X(name, kind, variable, description); kind is one of Int, Size, Count, Flag, Cpus, Writes,
// BackendName (option_kinds in options.cpp).
#define GFD_ENGINE_OPTIONS(X)                                                                      \
  X(device, Int, "GFD_DEVICE", "CUDA device ordinal the engine serves.")                           \
  X(staging_bytes, Size, "GFD_STAGING_BYTES",                                                      \
    "Pinned host staging ring (and its device twin), cut into slots of slot_bytes; 2..65536 "      \
    "slots.")                                                                                      \
  X(slot_bytes, Size, "GFD_SLOT_BYTES",                                                            \
    "Largest chunk one DMA moves (one staging slot); at least 4096, a multiple of 16.")            \
  X(chunk_bytes_to_host, Size, "GFD_CHUNK_BYTES_TO_HOST",                                          \
    "Device to host: the largest chunk, 0 (slot_bytes) or 4096..slot_bytes, a multiple of 16.")    \
  X(first_chunk_bytes, Size, "GFD_FIRST_CHUNK_BYTES",                                              \
    "First chunk of a transfer (gets the copy engine busy early); later chunks double up to "      \
    "slot_bytes. At least 4096.")                                                                  \
  X(piece_bytes, Size, "GFD_PIECE_BYTES",                                                          \
    "Work unit of one gather thread; at least 256, at most 32768 pieces a slot.")                  \
  X(direct_min_bytes, Size, "GFD_DIRECT_MIN_BYTES",                                                \
    "Host to device: pinned blocks of at least this size go by the copy engine straight from "     \
    "host "                                                                                        \
    "memory, unstaged (0: never).")                                                                \
  X(direct_min_bytes_to_host, Size, "GFD_DIRECT_MIN_BYTES_TO_HOST",                                \
    "Device to host: the same for pinned destinations (0: never).")                                \
  X(strided_min_rows, Count, "GFD_STRIDED_MIN_ROWS",                                               \
    "Runs of at least this many equal blocks at one constant pitch on both sides go as one 2D "    \
    "copy "                                                                                        \
    "(0 or 1: never).")                                                                            \
  X(strided_min_bytes, Size, "GFD_STRIDED_MIN_BYTES",                                              \
    "The bytes such a run must hold to go as a 2D copy.")                                          \
  X(inline_gather_bytes, Size, "GFD_INLINE_GATHER_BYTES",                                          \
    "Transfers of at most this size are gathered by the calling thread alone, their one DMA on "   \
    "the "                                                                                         \
    "caller's stream.")                                                                            \
  X(gather_threads, Int, "GFD_GATHER_THREADS",                                                     \
    "Gather threads; 0: one per CPU of the engine's share, less one (at most 16).")                \
  X(copy_streams, Int, "GFD_COPY_STREAMS",                                                         \
    "Copy streams for host-to-device DMAs, 1..16; device to host has one more.")                   \
  X(numa_node, Int, "GFD_NUMA_NODE",                                                               \
    "NUMA node of the staging ring and gather threads: -1 the GPU's node, -2 no binding.")         \
  X(use_all_local_cpus, Flag, "GFD_USE_ALL_LOCAL_CPUS",                                            \
    "Use all of the GPU's local CPUs, not an equal share among the GPUs of its NUMA node.")        \
  X(cpus, Cpus, "GFD_CPUS",                                                                        \
    "CPUs for the gather threads, as a list such as 0-7,16 (empty: chosen as above).")             \
  X(spin_us, Int, "GFD_SPIN_US",                                                                   \
    "How long an idle gather thread spins before it parks, in microseconds.")                      \
  X(submitter_gathers, Flag, "GFD_SUBMITTER_GATHERS",                                              \
    "The calling thread gathers too; copy_to_device returns once the data is staged.")             \
  X(staging_writes, Writes, "GFD_STAGING_WRITES",                                                  \
    "How the gather threads write staging: auto (streaming where the CPU has it, else plain), "    \
    "cldemote, streaming or plain.")                                                               \
  X(kernel_max_bytes, Size, "GFD_KERNEL_MAX_BYTES",                                                \
    "Gather backend: transfers of at most this size, all host memory pinned, are copied by an SM " \
    "kernel (0: never; only where the SMs are idle during transfers).")                            \
  X(pageable_cache_ms, Int, "GFD_PAGEABLE_CACHE_MS",                                               \
    "How long a 2 MiB host region seen pageable is remembered, in ms (0..3600000).")               \
  X(check_overlaps, Flag, "GFD_CHECK_OVERLAPS",                                                    \
    "Reject a transfer whose destination ranges overlap.")                                         \
  X(stream_ordered_to_host, Flag, "GFD_STREAM_ORDERED_TO_HOST",                                    \
    "Device to host: work queued on the caller's stream afterwards waits until every byte is in "  \
    "host "                                                                                        \
    "memory (an event recorded there acknowledges the copy), not only for the DMAs.")              \
  X(backend, BackendName, "GFD_BACKEND",                                                           \
    "How transfers are carried out: gather, batch_async, per_block or zero_copy_kernel.")

namespace gfd::detail {

struct OptionInfo {
  const char* name;
  const char* variable;
  const char* values;  // what the value may be, in words ("size", "integer", ...)
  const char* description;
};

// Every option, in the order of the list above.
std::span<const OptionInfo> option_table();

}  // namespace gfd::detail
