// gfd — fast scattered KV-cache block transfers between host memory and GPUs.
// Umbrella header: include this one.
#pragma once

#include "gfd/cache_set.hpp"
#include "gfd/engine.hpp"
#include "gfd/error.hpp"
#include "gfd/group.hpp"
#include "gfd/host_pool.hpp"
#include "gfd/options.hpp"
#include "gfd/stats.hpp"
#include "gfd/types.hpp"
