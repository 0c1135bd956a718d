// A CUDA source of a program outside gfd's tree that includes gfd's public API: it compiles only
// when gfd::gfd carries C++20 to CUDA sources (std::span), and it runs where a GPU is or is not.
#include <cstdio>
#include <gfd/gfd.hpp>
#include <span>
#include <vector>

__global__ void mark(int* flag) { *flag = 1; }

int main() {
  std::vector<gfd::BlockCopy> blocks(2);
  const std::span<const gfd::BlockCopy> view(blocks);
  std::printf("gfd consumer: %zu blocks in a std::span; error codes include '%s'\n", view.size(),
              gfd::to_string(gfd::ErrorCode::kNoDevice));
  try {
    gfd::Engine engine{gfd::EngineOptions{}};
    std::printf("gfd consumer: engine on GPU 0 with %d gather threads\n",
                engine.stats().gather_threads);
  } catch (const gfd::Error& e) {
    if (e.code() != gfd::ErrorCode::kNoDevice) {
      std::fprintf(stderr, "gfd consumer: unexpected error [%s]: %s\n", gfd::to_string(e.code()),
                   e.what());
      return 1;
    }
    std::printf("gfd consumer: no GPU here, as expected: %s\n", e.what());
  }
  return 0;
}
