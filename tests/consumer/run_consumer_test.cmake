# gfd_consumer_test: installs the gfd just built into a temporary prefix, configures and builds
# the consumer project beside this script against it, and runs the program. Proves that
#  - a consumer's CUDA source including <gfd/gfd.hpp> compiles with no C++ standard of its own
#    (gfd::gfd carries cuda_std_20),
#  - find_package(gfd) needs no libnuma headers (only the library, for a static libgfd),
#  - the consumer links the CUDA runtime gfd was built with (shared by default),
#  - the install holds the licence and no file of the Python extension.
# Prints "SKIPPED: <reason>" (CTest then reports the test as skipped) when it cannot run here.
#
# Variables: GFD_BUILD_DIR, SOURCE_DIR, WORK_DIR, CONFIG, GENERATOR, CXX_COMPILER, CUDA_COMPILER,
# CUDA_ARCH, CUDART (Shared or Static).
cmake_minimum_required(VERSION 3.25)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gfd_consumer_test: ${what} failed (${rc}):\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

if(NOT EXISTS "${CUDA_COMPILER}")
  message("SKIPPED: no CUDA compiler at '${CUDA_COMPILER}'")
  return()
endif()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")

run("installing gfd" "${CMAKE_COMMAND}" --install "${GFD_BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")

# A plain install holds the C++ library, its headers, CMake package and licence, and nothing of
# the Python extension (its own install component), even from a build that has it.
file(GLOB_RECURSE python_files "${prefix}/*.py" "${prefix}/*_gfd*")
if(python_files)
  message(FATAL_ERROR "gfd_consumer_test: the install holds Python files: ${python_files}")
endif()
if(NOT EXISTS "${prefix}/share/doc/gfd/LICENSE")
  message(FATAL_ERROR "gfd_consumer_test: the install holds no share/doc/gfd/LICENSE")
endif()
run("configuring the consumer" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
    "-DCMAKE_BUILD_TYPE=${CONFIG}" "-DCMAKE_PREFIX_PATH=${prefix}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}"
    "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH}")

# find_package(gfd) must not have looked for numa.h (no public header includes it).
file(STRINGS "${build}/CMakeCache.txt" numa_include REGEX "^NUMA_INCLUDE_DIR")
if(numa_include)
  message(FATAL_ERROR "gfd_consumer_test: find_package(gfd) looked for libnuma's headers: ${numa_include}")
endif()

run("building the consumer" "${CMAKE_COMMAND}" --build "${build}" --config "${CONFIG}")

set(exe "${build}/gfd_consumer")
if(NOT EXISTS "${exe}")
  file(GLOB_RECURSE exe "${build}/gfd_consumer" "${build}/*/gfd_consumer")
endif()
run("running the consumer" "${exe}")
message("${run_output}")

# The runtime: libcudart.so among the program's shared libraries exactly when gfd links it shared.
file(GET_RUNTIME_DEPENDENCIES EXECUTABLES "${exe}" RESOLVED_DEPENDENCIES_VAR resolved
     UNRESOLVED_DEPENDENCIES_VAR unresolved)
set(cudart_shared FALSE)
foreach(lib IN LISTS resolved unresolved)
  if(lib MATCHES "libcudart\\.so")
    set(cudart_shared TRUE)
  endif()
endforeach()
if(CUDART STREQUAL "Shared" AND NOT cudart_shared)
  message(FATAL_ERROR "gfd_consumer_test: gfd links the CUDA runtime shared, but the consumer does not load libcudart.so")
elseif(CUDART STREQUAL "Static" AND cudart_shared)
  message(FATAL_ERROR "gfd_consumer_test: gfd links the CUDA runtime statically, but the consumer loads libcudart.so")
endif()
message("gfd_consumer_test: passed (CUDA runtime ${CUDART})")
