// gfd_options_doc: writes docs/options.md from the option table (src/option_table.hpp), with the
// defaults of EngineOptions{}. `gfd_options_doc --check FILE` exits 1 when FILE differs.
//   build/tests/gfd_options_doc > docs/options.md
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/option_table.hpp"
#include "gfd/options.hpp"

namespace {

constexpr const char* kRegenerate =
    "cmake --build build --target gfd_options_doc && build/tests/gfd_options_doc > docs/options.md";

std::string document() {
  std::ostringstream out;
  out << "# Engine options\n\n"
      << "<!-- Generated from src/option_table.hpp; do not edit. Regenerate with:\n     "
      << kRegenerate << " -->\n\n"
      << "Every field of `gfd::EngineOptions`, by its name (C++ `EngineOptions::set` / `get`; "
         "Python takes\n"
      << "the same names) and by its environment variable, read where the program asks for it\n"
      << "(`EngineOptions::from_env()`). Sizes are bytes and take K, M and G suffixes; booleans "
         "are\n"
      << "`1`/`true`/`on` or `0`/`false`/`off`. Limits are checked when an engine is made\n"
      << "(`EngineOptions::validate`). Measured effects of the settings: docs/performance.md.\n\n"
      << "| Option | Variable | Values | Default | Meaning |\n"
      << "|---|---|---|---|---|\n";
  const gfd::EngineOptions defaults;
  for (const auto& opt : gfd::detail::option_table()) {
    std::string def = defaults.get(opt.name);
    if (def.empty()) def = "\"\"";
    out << "| `" << opt.name << "` | `" << opt.variable << "` | " << opt.values << " | `" << def
        << "` | " << opt.description << " |\n";
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string doc = document();
  if (argc == 3 && std::string(argv[1]) == "--check") {
    std::ifstream in(argv[2], std::ios::binary);
    std::ostringstream have;
    have << in.rdbuf();
    if (!in || have.str() != doc) {
      std::cerr << argv[2]
                << " differs from the option table (src/option_table.hpp). Regenerate it:\n  "
                << kRegenerate << "\n";
      return 1;
    }
    return 0;
  }
  if (argc != 1) {
    std::cerr << "usage: gfd_options_doc [--check FILE]\n";
    return 2;
  }
  std::cout << doc;
  return 0;
}
