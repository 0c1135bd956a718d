#include "staging.hpp"

namespace gfd::detail {

HostStaging::HostStaging(Device& device, std::size_t bytes, int numa_node)
    : memory_(bytes, numa_node, "staging"), bytes_(bytes) {
  memory_.populate();  // fault every page in now, not during the first transfer
  memory_.register_with(device);
}

}  // namespace gfd::detail
