# gfd_multi_gpu_benchmark --one-gpu on the emulated device (--emulated, also where a GPU is
# visible): it runs 1, 2 and 4 engines with every default backend and writes one CSV row per
# engine count and case, every transferred byte verified. Structure only: no figure is judged.
#   cmake -DBENCH=<gfd_multi_gpu_benchmark> -DWORK_DIR=<dir> -P run_one_gpu_bench_test.cmake
cmake_minimum_required(VERSION 3.25)  # lists keep their empty cells (CMP0007)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(csv "${WORK_DIR}/one_gpu.csv")

# Small staging rings: eight engines' worth fits any machine.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env GFD_STAGING_BYTES=16M
          ${BENCH} --one-gpu --emulated --engines 2,4 --blocks 64 --iters 20 --warmup 1
          --pool-bytes 16M --csv ${csv}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--one-gpu failed (${rc}):\n${out}\n${err}")
endif()
foreach(text "--emulated: the emulated device stands in" "gather           4 engines over 1: call"
             "batch_async      4 engines over 1: call")
  string(FIND "${out}" "${text}" at)
  if(at LESS 0)
    message(FATAL_ERROR "'${text}' is not in the output:\n${out}")
  endif()
endforeach()

file(STRINGS "${csv}" lines)
list(POP_FRONT lines header)
set(want_header "mode,sources,engines,backend,blocks,block_size,call_p50_us,call_p90_us,call_ratio,\
cpu_p50_us,cpu_p90_us,cpu_ratio,e2e_p50_us,e2e_p90_us,e2e_ratio,p50_gbps,ref_gbps,threads,\
caller_cpus,gather_cpus,verified")
if(NOT header STREQUAL want_header)
  message(FATAL_ERROR "CSV header:\n${header}\nexpected:\n${want_header}")
endif()
list(LENGTH lines rows)
if(NOT rows EQUAL 12)  # engines 1 (always), 2, 4 x contiguous, gather, batch_async, per_block
  message(FATAL_ERROR "${rows} CSV rows, expected 12:\n${lines}")
endif()

set(seen "")
foreach(line IN LISTS lines)
  string(REPLACE "," ";" f "${line};")  # the trailing ';' keeps an empty last cell
  list(GET f 0 mode)
  list(GET f 2 n)
  list(GET f 3 backend)
  list(GET f 8 call_ratio)
  list(GET f 18 callers)
  list(GET f 19 gather_cpus)
  list(GET f 20 verified)
  list(APPEND seen "${n}:${backend}")
  if(NOT mode STREQUAL "host-only")
    message(FATAL_ERROR "not labelled host-only: ${line}")
  endif()
  foreach(i 6 9 12 15 16)  # call, cpu and e2e P50 and both rates: measured
    list(GET f ${i} v)
    if(NOT v MATCHES "^[0-9.e+-]+$" OR v EQUAL 0)
      message(FATAL_ERROR "column ${i} is '${v}': ${line}")
    endif()
  endforeach()
  if(n EQUAL 1 AND NOT call_ratio MATCHES "^1(\\.0+)?$")
    message(FATAL_ERROR "one engine's call_ratio is '${call_ratio}', not 1: ${line}")
  endif()
  string(REPLACE " " ";" callers "${callers}")
  list(LENGTH callers ncallers)
  if(NOT ncallers EQUAL n)
    message(FATAL_ERROR "${ncallers} caller CPUs for ${n} engines: ${line}")
  endif()
  if(backend STREQUAL "contiguous")
    set(want_verified "")
  else()
    set(want_verified 1)
  endif()
  if(NOT verified STREQUAL want_verified)
    message(FATAL_ERROR "verified is '${verified}', expected '${want_verified}': ${line}")
  endif()
  if(backend STREQUAL "gather")
    string(REPLACE "|" ";" sets "${gather_cpus}")
    list(LENGTH sets nsets)
    if(NOT nsets EQUAL n)
      message(FATAL_ERROR "${nsets} gather CPU sets for ${n} engines: ${line}")
    endif()
  endif()
endforeach()
foreach(n 1 2 4)
  foreach(backend contiguous gather batch_async per_block)
    list(FIND seen "${n}:${backend}" at)
    if(at LESS 0)
      message(FATAL_ERROR "no row for ${n} engines, ${backend}:\n${lines}")
    endif()
  endforeach()
endforeach()

# Bad flags name themselves and stop before anything runs.
foreach(bad "--engines=0" "--one-gpu;--counts=2" "--one-gpu;--json=x.json" "--one-gpu;--gpus=0,1")
  execute_process(COMMAND ${BENCH} ${bad} --emulated RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  list(GET bad -1 flag)
  string(REGEX REPLACE "=.*" "" flag "${flag}")
  string(FIND "${err}" "${flag}" at)
  if(rc EQUAL 0 OR at LESS 0)
    message(FATAL_ERROR "${bad}: status ${rc}, stderr without ${flag}:\n${err}")
  endif()
endforeach()
message(STATUS "gfd_multi_gpu_benchmark --one-gpu: ${rows} rows, every transfer verified")
