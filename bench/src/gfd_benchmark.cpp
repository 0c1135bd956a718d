// gfd_benchmark: gfd against the CUDA peers, each as a ratio to the contiguous pinned DMA of the
// same bytes measured in the same run (layouts.hpp lists the layouts; --help each one's flags).
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "layouts.hpp"

namespace {

// The value of --layout in argv: "paged" when absent. Throws std::invalid_argument for anything
// but paged, pool or strided.
std::string layout_flag(int argc, char** argv) {
  std::string layout = "paged";  // the runtime's call is the default face of the benchmark
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--layout=", 0) == 0)
      layout = a.substr(9);
    else if (a == "--layout" && i + 1 < argc)
      layout = argv[++i];
  }
  if (layout != "pool" && layout != "paged" && layout != "strided")
    throw std::invalid_argument("--layout=" + layout + ": expected paged, pool or strided");
  return layout;
}

}  // namespace

int main(int argc, char** argv) try {
  // Line-buffered stdout: the notes and header lines reach a pipe in order with the progress
  // lines and the engines' "gfd:" lines, which go to stderr.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string layout = layout_flag(argc, argv);
  if (layout == "paged") return gfd::bench::run_paged_benchmark(argc, argv);
  return gfd::bench::run_pool_benchmark(argc, argv, layout);
} catch (const std::exception& e) {
  std::fprintf(stderr, "gfd_benchmark: %s\n", e.what());
  return 1;
}
