// per_block and batch_async: the copies go on the caller's stream as driver calls, one
// cudaMemcpyAsync per block or one cudaMemcpyBatchAsync per slot_bytes of blocks. The
// comparison baselines, and the way runtimes move blocks today.
#pragma once

#include <memory>

#include "backends/backend.hpp"

namespace gfd::detail {

std::unique_ptr<BackendImpl> make_per_block(const BackendSetup& setup);
std::unique_ptr<BackendImpl> make_batch_async(const BackendSetup& setup);

}  // namespace gfd::detail
