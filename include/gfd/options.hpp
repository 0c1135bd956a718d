// gfd — engine options.
#pragma once

#include <cstddef>
#include <string>

#include "gfd/types.hpp"

namespace gfd {

/// Options of one engine. Every field has a working default; zero or negative values mean
/// "choose for me" where the comment says so. `from_env()` applies GFD_* overrides.
struct EngineOptions {
  /// CUDA device ordinal the engine serves.
  int device = 0;
  /// Pinned host staging ring size (and its device twin's). The ring is cut into slots of
  /// `slot_bytes`. A device-to-host transfer larger than the ring's free slots holds its call
  /// until slots come back. On an H200 (bench/history/2026-12-03-s14-final.md, three rotated
  /// rounds) 128 MiB took the call of 4096 x 32 KB swap-outs (128 MB) from 1.51-1.55 ms to
  /// 0.66-1.03 ms against 64 MiB, at the same rates both ways; 256 MiB moved swap-outs slower
  /// (82.5-88.1% against 86.8-90.7%).
  std::size_t staging_bytes = std::size_t{128} << 20;
  /// Largest chunk moved by one DMA (one staging slot). Must divide into `staging_bytes` at
  /// least twice so that gathering and DMA can overlap.
  std::size_t slot_bytes = std::size_t{2} << 20;
  /// Device to host: the largest chunk (0: slot_bytes). Device-to-host chunks are placed in
  /// host memory by the gather threads only after their DMA, so smaller ones pipeline better
  /// there, while host to device each chunk costs the call its driver calls: this lets the two
  /// directions share one ring of large slots. At most slot_bytes, at least 4096. Measured on
  /// an H200 (bench/history/2026-12-03-s12-batched-placement.md): 4 MiB slots with 2 MiB
  /// device-to-host chunks still moved 4 KB swap-outs at 65-68% against 72-74% with 2 MiB
  /// slots, so that loss comes from the ring's fewer slots, not the chunk size; 0 stays.
  std::size_t chunk_bytes_to_host = 0;
  /// Size of the first chunk of a transfer; later chunks double up to `slot_bytes`. A small
  /// first chunk gets the copy engine busy early (pipeline fill).
  std::size_t first_chunk_bytes = std::size_t{256} << 10;
  /// Work unit of one gather thread. Chunks are split into pieces of about this size so that
  /// every thread helps to fill the chunk the copy engine needs next.
  std::size_t piece_bytes = std::size_t{32} << 10;
  /// Host to device: blocks (after coalescing) of at least this many bytes whose host side is
  /// pinned are copied by the copy engine straight from host memory, with no staging, in
  /// cudaMemcpyBatchAsync groups. On an H200, 2048 x 64 KB blocks went from 70% of the line rate
  /// staged to 90% direct, 256 KB blocks from 76% to 97% (bench/RESULTS.md, 2026-12-01); in the
  /// paged case (64 tensors x 64 blocks) 32 KB blocks moved 87-88% as slot-sized batches
  /// against 63-66% staged, 16 KB blocks 42% against 65% (bench/history/
  /// 2026-12-01-s6-runtime-call.md); with this default gfd's own 32 KB swap-ins then moved
  /// 59.7-90.2% over five runs in two leases, 88% through Python (-s6b-final-code.md). That
  /// bimodal rate is the driver's cost per copy on the calling thread (0.55-1 us), which also
  /// holds the call: 4096 x 32 KB swap-ins blocked it 2.2-4.6 ms. Since swap-ins larger than the
  /// ring no longer wait for slots in the call (defer_slot_waits), 32 KB blocks are staged: in
  /// one lease (rotated A/B, five runs each; bench/history/2026-12-03-s13-deferred-slots.md) they
  /// moved 68.0-72.2% staged with a 298-536 us call against 59.4-89.2% direct with 2.2-4.0 ms,
  /// and in another lease the direct path moved 50.8-60.0%. Through Python the staged default
  /// moved 0.63-0.74 of the line rate in six runs of the fourteenth session, the batch_async
  /// backend 0.54-0.88, and the direct path 0.52 / 0.89 (-s14-final.md). Set 32K for the direct
  /// path's higher peak where the call's length does not matter. 0 disables the direct path.
  std::size_t direct_min_bytes = std::size_t{64} << 10;
  /// The same for device to host (pinned host destinations). On the H200 32 KB blocks moved
  /// 85-91% staged against 79% as batches, 64 KB blocks 95% direct (the same notes). 0
  /// disables it.
  std::size_t direct_min_bytes_to_host = std::size_t{64} << 10;
  /// Host to device, mid-size blocks on both copy-engine paths at once: of the pinned blocks of
  /// at least direct_split_min_bytes and below direct_min_bytes, direct_split_percent percent
  /// (spread evenly over the list) go straight from host memory like the direct path's, on copy
  /// streams of their own, while the rest is staged; the copy engine's per-copy cost and the
  /// gather's host-memory traffic then overlap instead of one path carrying every block. 0 (or a
  /// minimum of 0, or one not below direct_min_bytes) keeps every such block staged. Off by
  /// default: on an H200 it lost, 16 KB swap-ins moving 66-74% all staged against 20-25% with
  /// 25% direct and 12% with 50%, and 32 KB ones 69-74% split against 63-89% all direct
  /// (bench/history/2026-12-02-s10-variants.md).
  std::size_t direct_split_min_bytes = 0;
  int direct_split_percent = 0;
  /// Constant-stride runs: at least this many consecutive blocks of one size, together at least
  /// strided_min_bytes, whose host side is pinned and whose sources and destinations each
  /// advance by one constant pitch (a request's blocks at a fixed pitch, a layer-major pool, the
  /// seed's 2x-stride layout, one block id of every layer when the layers' caches share one
  /// allocation at a constant stride, as vLLM 0.33 allocates them) go to the copy engine as 2D
  /// copies (cudaMemcpy2DAsync; several runs of a transfer in one cudaMemcpy3DBatchAsync)
  /// instead of being gathered; the rest of the list goes the usual way in the same transfer.
  /// On an H200 one 2D copy of 2048 rows of 4 KB moved 99.8% of a contiguous DMA, and 64 copies
  /// of 64 layer-strided rows (one per block) 77% at 8 KB rows and 92% at 32 KB
  /// (tests/micro/copy2d_cost, bench/history/2026-12-02-s8-2d-runs.md); gfd moved the seed's
  /// layout (2048 x 4 KB at a pitch of 2 blocks) at 95.4-96.8% host to device and 96.4-96.8%
  /// device to host (-s9-final-code.md). 0 or 1 disables it.
  /// Host to device and device to host.
  std::size_t strided_min_rows = 2;
  /// The bytes a constant-stride run must hold to go as a 2D copy (see strided_min_rows): 512
  /// KiB, the 128 rows of 4 KB that beat gathering on an H200 (63-66% of the line rate against
  /// 38-40%, bench/history/2026-12-01-s6b-final-code.md), and a block of 64 layers' 8 KB pages.
  std::size_t strided_min_bytes = std::size_t{512} << 10;
  /// A staging chunk whose pinned host side lies in contiguous runs, each as long as the direct
  /// path's blocks (direct_min_bytes, direct_min_bytes_to_host; the chunk's edges may cut two),
  /// is not copied by the CPU: the copy engine moves the runs in place (one batched copy per
  /// chunk) between host memory and the device staging area, where the scatter kernel places
  /// (or the pack kernel packs) the blocks. A runtime whose host cache holds every layer's page
  /// of a block side by side (gfd.kv_worker's "block" layout) moves small pages this way with
  /// no CPU copy: on an H200, 8 KB pages of 64 layers loaded at 72-73% of the line rate
  /// (bench/history/2026-12-02-s7-vllm-worker.md).
  bool host_direct = true;
  /// A CacheSet's transfer of equal blocks that all go through staging (none direct, no 2D
  /// runs, host caches pinned and not side by side) is planned from its ids: the submitter
  /// checks the ids and cuts the chunks by arithmetic, and each gather thread makes its own
  /// piece's copies from the ids (device to host the submitter makes them chunk by chunk, for
  /// the pack kernel), instead of listing, planning and packing every block on the calling
  /// thread. The blocks of such a plan are never coalesced, so ids that would make many blocks
  /// adjacent on both sides (a quarter of the rows, where some pair is packed at its block size)
  /// keep the listed path. false: every CacheSet transfer is listed and planned block by block,
  /// as before the eleventh session.
  bool plan_from_ids = true;
  /// Transfers of at most this many bytes are gathered by the submitting thread alone (waking
  /// the pool would cost more than the copy). Any transfer of one chunk (up to
  /// first_chunk_bytes) has its one DMA on the caller's stream instead of the copy lanes, with
  /// no stream joins; above this size the gather threads share its pieces with the submitter.
  /// On an H200 host 16 x 4 KB took 19-21 us call to sync with the pool against 22-26 us alone,
  /// 64 x 4 KB 30-35 us against 38-42 us through the lanes (bench/RESULTS.md).
  std::size_t inline_gather_bytes = std::size_t{16} << 10;
  /// Gather threads; 0 = one per GPU-local CPU, less one for the submitting thread.
  int gather_threads = 0;
  /// Dedicated copy streams (copy-engine lanes) for host-to-device DMAs. Device-to-host DMAs
  /// have one more stream of their own.
  int copy_streams = 2;
  /// NUMA node for staging memory and gather threads; -1 = the GPU's own node (none if the
  /// system reports no locality); -2 = do not bind.
  int numa_node = -1;
  /// By default the GPUs that share a NUMA node (or, where the system reports no locality, all
  /// GPUs) split its CPUs into equal parts, one per GPU's engine, so that engines never compete
  /// for a CPU: every GPU of the host that sysfs lists counts, whether this process sees it or
  /// not, so that one process per GPU (vLLM's tensor parallelism, containers with one visible
  /// GPU) splits the CPUs the same way. True: this engine uses all of its GPU's local CPUs.
  bool use_all_local_cpus = false;
  /// The CPUs for this engine's gather threads, as a list ("0-7,16"); "" (default): chosen as
  /// above. Operators who place processes themselves set it (or GFD_CPUS); it must name only CPUs
  /// this process may run on, and overrides the split and the node's CPUs (staging memory still
  /// goes on the GPU's node, or numa_node's).
  std::string cpus;
  /// How long an idle gather thread spins before it parks, in microseconds.
  int spin_us = 200;
  /// The submitting thread gathers too, until its pieces are all taken, and copy_to_device
  /// returns once the data is staged. Off by default: the call returns once every DMA is
  /// enqueued and the gather threads do the copying, so a runtime's scheduling thread (the one
  /// that launches the model) is not held for the transfer. Transfers of one chunk are always
  /// gathered before the call returns (inline_gather_bytes, first_chunk_bytes).
  bool submitter_gathers = false;
  /// How the gather threads write staging, which the copy engine reads right after; it decides
  /// how often each staged byte crosses DRAM. kCldemote: plain stores, then CLDEMOTE of every
  /// written line, which moves it from the core's private cache to the shared L3 where the
  /// copy engine reads it (one DRAM crossing per byte: the source read). kStreaming:
  /// non-temporal stores (the slot goes through DRAM: three crossings). kPlain: plain stores
  /// (the copy engine then reads lines out of a core's private cache: slow). kAuto (default)
  /// picks kStreaming where the CPU has it, else kPlain (measured in the engine on an H200,
  /// kCldemote tied with kStreaming host to device and lost device to host: bench/RESULTS.md);
  /// a requested mode the CPU lacks falls back (CLDEMOTE needs its CPUID flag, streaming AVX2). Device-to-host transfers place
  /// blocks with streaming stores in kCldemote and kStreaming modes (kCldemote also demotes the
  /// staging lines it read, for the next inbound DMA) and with plain stores in kPlain mode.
  /// EngineStats::staging_writes reports the mode in force.
  StagingWrites staging_writes = StagingWrites::kAuto;
  /// Enqueue each chunk's DMA when the chunk is handed to the gather threads, behind a wait on
  /// a flag in pinned memory that the thread finishing the chunk sets (a stream memory
  /// operation), so that no driver call sits between gathering and DMA. Where the GPU has no
  /// 64-bit stream memory operations the finishing thread issues the DMA itself.
  bool preissue = true;
  /// Host to device, staged chunks with scattered destinations: each copy lane places its
  /// chunks with one kernel launch for several of them (a run of up to placement_chunks, the
  /// lanes together at most half the ring's slots, or what is left at the transfer's end), and
  /// that kernel marks the chunks' slots free in pinned memory, instead of one scatter kernel
  /// and one slot event per chunk. The call then makes two driver calls per chunk (the flag wait and the DMA)
  /// instead of five, and the DMAs of a lane never queue behind a kernel that waits for SMs a
  /// model's kernels hold. On an H200 (paged case, 64 caches x 64 ids, rotated A/B, three rounds;
  /// bench/history/2026-12-03-s12-batched-placement.md) 4 KB swap-ins moved 67.5-69.9% of the
  /// line rate with a 57-78 us call against 56.4-65.1% with 112-200 us, 16 KB ones 72.6-77.9%
  /// against 70.8-71.5%; beside back-to-back bf16 matmuls 4 KB swap-ins kept 72-78% of their
  /// idle rate against 44-46%, 16 KB ones 85-89% against 44-46%. false: one scatter kernel (two
  /// thread blocks) and one event per chunk, as before the twelfth session. Needs a GPU that
  /// reads pinned memory at its host address (every 64-bit Linux system with unified
  /// addressing); elsewhere it is off.
  bool batch_placement = true;
  /// Batched placement with preissue, a swap-in larger than the free slots of the ring: the
  /// submitting call takes a slot whose last chunk is enqueued but not yet placed without waiting
  /// for it, and the gather threads that fill the slot wait for its placed flag instead (no
  /// driver call: the placing kernel writes it). So the call returns once every DMA is enqueued
  /// whatever the transfer's size, instead of holding its caller until all but the last ring of
  /// the transfer has moved. false: the call waits for each slot, as before the thirteenth session.
  bool defer_slot_waits = true;
  /// Device to host, staged chunks with scattered sources: the pack lane packs several chunks
  /// (up to `placement_chunks`, at most half the ring's slots; thread blocks as
  /// `placement_blocks`) with one kernel launch, and the device-to-host lane waits for that
  /// launch once, instead of one packing launch and one wait per chunk. Beside a model's
  /// kernels each launch waits for SMs: on an H200 beside back-to-back matmuls, 4096-block
  /// swap-outs of 4/16/32 KB kept 74-79 / 93-95 / 92.5-93.5% of their idle rate with it
  /// against 42-45 / 36.5-37 / 37.5-38% with a launch per chunk, at the same idle rate and with
  /// a call 35-46% shorter (three rotated runs, fifteenth session, bench/RESULTS.md). false: one
  /// packing launch and one wait per chunk, as before the fifteenth session.
  bool batch_packing = true;
  /// Batched placement: the chunks one placing launch of a lane takes at most (1..32; the lanes
  /// together never leave more than half the ring's slots unplaced: 16 a lane with the default
  /// 128 MiB ring of 2 MiB slots and two lanes, 8 with a 64 MiB ring). Few keep the placing
  /// close behind the DMAs; many make fewer launches, each waiting once for SMs beside a
  /// model's kernels. On an H200 (one lease, two rounds, a 64 MiB ring;
  /// bench/history/2026-12-03-s12-batched-placement.md) 2 chunks and 4 blocks moved no faster
  /// idle than 8 and 32, with device caches of 4 GB or 40 GB, and beside back-to-back matmuls
  /// kept 72% of the 4 KB swap-in rate against 88%.
  int placement_chunks = 8;
  /// Batched placement: the thread blocks (1024 threads each) of one placing launch at most
  /// (1..32), one per 256 KiB of the launch's data below that: the last launch of a transfer
  /// adds its time to the transfer's, so it is wide and short by default.
  int placement_blocks = 32;
  /// Time each staged host-to-device chunk's DMA on the GPU (two timing events around it) for
  /// EngineStats::dma_seconds. Off by default: on the H200 a timing event costs the copy engine
  /// about 3 us per chunk (tests/micro/dma_cost), and without them 2048 x 4 KB moved 0-6 points
  /// of the line rate faster in three comparisons (bench/RESULTS.md, 2026-12-01 fifth session).
  bool time_dmas = false;
  /// Gather backend: transfers of at most this many bytes whose host memory is all pinned are
  /// copied by the zero-copy SM kernel in one launch instead of the staging pipeline. 0 (the
  /// default) keeps every transfer off the SMs: a kernel queued behind a model's compute
  /// kernels waits for them (it needs SMs), exactly when a busy server swaps in small,
  /// latency-critical requests, while the copy engine does not wait. Set it (e.g. 1M) only
  /// where the SMs are known to be idle during swaps: a tiny transfer then finishes a few
  /// microseconds sooner.
  std::size_t kernel_max_bytes = 0;
  /// How long, in milliseconds, the engine remembers a 2 MiB region of host memory that the
  /// driver reported as pageable (not pinned), so that blocks there need no driver query per
  /// page. Pageable blocks are staged whatever their region; memory registered with
  /// cudaHostRegister after gfd saw it pageable is staged (correct, and slower for small
  /// transfers) for at most this long. 0 asks the driver about every page, every transfer; at
  /// most 3600000 (an hour).
  int pageable_cache_ms = 100;
  /// Check that no two destination ranges overlap (costs a sort of the block list when the
  /// destinations are not already in ascending order).
  bool check_overlaps = true;
  /// How transfers are carried out.
  Backend backend = Backend::kGather;

  /// `base` with every field overridden by its GFD_* environment variable where one is set:
  /// GFD_DEVICE, GFD_STAGING_BYTES, GFD_SLOT_BYTES, GFD_CHUNK_BYTES_TO_HOST, GFD_FIRST_CHUNK_BYTES, GFD_PIECE_BYTES,
  /// GFD_DIRECT_MIN_BYTES, GFD_DIRECT_MIN_BYTES_TO_HOST,
  /// GFD_STRIDED_MIN_ROWS, GFD_STRIDED_MIN_BYTES, GFD_INLINE_GATHER_BYTES, GFD_GATHER_THREADS, GFD_COPY_STREAMS,
  /// GFD_NUMA_NODE, GFD_SPIN_US, GFD_CHECK_OVERLAPS, GFD_SUBMITTER_GATHERS,
  /// GFD_USE_ALL_LOCAL_CPUS, GFD_CPUS, GFD_STAGING_WRITES ("auto", "cldemote", "streaming" or "plain"),
  /// GFD_PREISSUE, GFD_BATCH_PLACEMENT, GFD_DEFER_SLOT_WAITS, GFD_BATCH_PACKING, GFD_PLACEMENT_CHUNKS, GFD_PLACEMENT_BLOCKS, GFD_TIME_DMAS, GFD_KERNEL_MAX_BYTES, GFD_PAGEABLE_CACHE_MS, GFD_BACKEND (a backend name such
  /// as "batch_async"). Sizes accept K, M and G suffixes.
  /// Throws gfd::Error naming the variable when a value does not parse.
  static EngineOptions from_env(EngineOptions base);
  static EngineOptions from_env() { return from_env(EngineOptions{}); }

  /// Checks every field against its limits without opening a device (so a bad option is
  /// reported on a machine without a GPU too): copy_streams 1..16; slot_bytes >= 4096 and a
  /// multiple of 16; staging_bytes holding 2..65536 slots; at most 32768 pieces of piece_bytes
  /// (>= 256) per slot; chunk_bytes_to_host 0 or 4096..slot_bytes, a multiple of 16;
  /// placement_chunks and placement_blocks 1..32;
  /// first_chunk_bytes >= 4096; gather_threads 0..the CPUs this process may
  /// use; spin_us >= 0; numa_node >= -2 and, when >= 0, a node of this machine;
  /// pageable_cache_ms 0..3600000; device >= 0. Throws gfd::Error(kInvalidArgument) naming the
  /// field. Engines call it before they touch the device.
  void validate() const;
};

}  // namespace gfd
