// gfd — engine options.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gfd/types.hpp"

namespace gfd {

/// Options of one engine. Every field has a working default. Each field is also reachable by
/// its name (set, get, names) and by its GFD_* environment variable (from_env); docs/options.md
/// lists them all. Sizes are in bytes.
struct EngineOptions {
  /// CUDA device ordinal the engine serves. Default 0.
  int device = 0;
  /// Pinned host staging ring (and its device twin), cut into slots of slot_bytes. Default 128M.
  std::size_t staging_bytes = std::size_t{128} << 20;
  /// Largest chunk one DMA moves (one staging slot); the ring holds at least two. Default 2M.
  std::size_t slot_bytes = std::size_t{2} << 20;
  /// Device to host: the largest chunk, 0 or 4096..slot_bytes (0: slot_bytes). Default 0.
  std::size_t chunk_bytes_to_host = 0;
  /// First chunk of a transfer; later chunks double up to slot_bytes. Default 256K.
  std::size_t first_chunk_bytes = std::size_t{256} << 10;
  /// Work unit of one gather thread; chunks are cut into pieces of about this size. Default 32K.
  std::size_t piece_bytes = std::size_t{32} << 10;
  /// Host to device: pinned blocks of at least this size go by the copy engine straight from
  /// host memory, unstaged (0: never). Default 64K.
  std::size_t direct_min_bytes = std::size_t{64} << 10;
  /// The same for device to host (pinned destinations; 0: never). Default 64K.
  std::size_t direct_min_bytes_to_host = std::size_t{64} << 10;
  /// Runs of at least this many blocks at one constant pitch go as one 2D copy (0 or 1: never).
  /// Default 2.
  std::size_t strided_min_rows = 2;
  /// ... and of at least this many bytes together. Default 512K.
  std::size_t strided_min_bytes = std::size_t{512} << 10;
  /// Transfers of at most this size are gathered by the calling thread alone, with their one
  /// DMA on the caller's stream. Default 16K.
  std::size_t inline_gather_bytes = std::size_t{16} << 10;
  /// Gather threads; 0: one per CPU of the engine's share, less one. Default 0.
  int gather_threads = 0;
  /// Copy streams for host-to-device DMAs (device to host has one more), 1..16. Default 2.
  int copy_streams = 2;
  /// NUMA node of the staging ring and gather threads: -1 the GPU's node, -2 no binding.
  /// Default -1.
  int numa_node = -1;
  /// Use all of the GPU's local CPUs instead of an equal share among the GPUs of the node.
  /// Default false.
  bool use_all_local_cpus = false;
  /// CPUs for the gather threads as a list ("0-7,16"); "" chooses as above. Default "".
  std::string cpus;
  /// How long an idle gather thread spins before it parks, in microseconds. Default 200.
  int spin_us = 200;
  /// The calling thread gathers too, and copy_to_device returns once the data is staged.
  /// Default false.
  bool submitter_gathers = false;
  /// How the gather threads write staging (EngineStats::staging_writes says what is in force).
  /// Default kAuto.
  StagingWrites staging_writes = StagingWrites::kAuto;
  /// Gather backend: transfers of at most this size with all host memory pinned are copied by
  /// an SM kernel (0: never; set it only where the SMs are idle during transfers). Default 0.
  std::size_t kernel_max_bytes = 0;
  /// How long the engine remembers a 2 MiB host region as pageable, in ms (0..3600000).
  /// Default 100.
  int pageable_cache_ms = 100;
  /// Reject a transfer whose destination ranges overlap. Default true.
  bool check_overlaps = true;
  /// Device to host: work queued on the caller's stream after a transfer waits until every
  /// byte is in host memory, not only until its DMAs are done (the gather threads place staged
  /// bytes after them), so that an event recorded there acknowledges the copy. The stream then
  /// also waits for the placing. Default false.
  bool stream_ordered_to_host = false;
  /// How transfers are carried out. Default kGather.
  Backend backend = Backend::kGather;

  /// `base` with every field whose GFD_* environment variable is set overridden by it (the
  /// values `set` accepts). Throws gfd::Error(kInvalidArgument) naming the variable.
  static EngineOptions from_env(EngineOptions base);
  static EngineOptions from_env() { return from_env(EngineOptions{}); }

  /// Sets the field called `name` from text: integers; sizes with an optional K, M or G suffix;
  /// booleans as 1/true/on or 0/false/off; enums by name ("streaming", "batch_async"). Returns
  /// false for an unknown name; throws gfd::Error(kInvalidArgument) naming the option for a bad
  /// value. Limits are checked by validate().
  bool set(std::string_view name, std::string_view value);
  /// The field called `name` as text that `set` accepts; throws gfd::Error for an unknown name.
  std::string get(std::string_view name) const;
  /// Every option's name, in declaration order.
  static std::vector<std::string> names();

  /// Checks every field against its limits without opening a device; throws
  /// gfd::Error(kInvalidArgument) naming the field. Engines call it before they touch the device.
  void validate() const;
};

}  // namespace gfd
