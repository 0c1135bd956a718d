# gfd_benchmark --layout paged with gfd's stages alone (--methods gfd,gather_only,place_only,
# --quick, both ways): on the emulated device where no GPU is visible (gather_only there, its
# copies verified; place_only skipped as a GPU's), on the GPU otherwise (place_only too, which
# moves scratch bytes and is not verified). Structure only: no figure is judged.
#   cmake -DBENCH=<gfd_benchmark> -DWORK_DIR=<dir> -P run_paged_stages_test.cmake
cmake_minimum_required(VERSION 3.25)  # lists keep their empty cells (CMP0007)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(csv "${WORK_DIR}/stages.csv")

execute_process(
  COMMAND ${BENCH} --layout paged --quick --direction both --methods gfd,gather_only,place_only
          --csv ${csv}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gfd_benchmark failed (${rc}):\n${out}\n${err}")
endif()

file(STRINGS "${csv}" lines)
list(POP_FRONT lines header)
set(seen "")
set(mode "")
foreach(line IN LISTS lines)
  string(REPLACE "," ";" f "${line};")  # the trailing ';' keeps an empty last cell
  list(GET f 0 mode)
  list(GET f 3 direction)
  list(GET f 10 method)
  list(GET f 12 p50_us)
  list(GET f 22 verified)
  list(APPEND seen "${direction}:${method}")
  if(NOT p50_us MATCHES "^[0-9.e+-]+$" OR p50_us EQUAL 0)
    message(FATAL_ERROR "p50_us is '${p50_us}': ${line}")
  endif()
  if(method STREQUAL "gather_only" OR method STREQUAL "gfd")
    set(want_verified 1)
  else()  # the contiguous DMA and place_only move no bytes of the caches
    set(want_verified "")
  endif()
  if(NOT verified STREQUAL want_verified)
    message(FATAL_ERROR "verified is '${verified}', expected '${want_verified}': ${line}")
  endif()
endforeach()
set(want gfd gather_only)
if(mode STREQUAL "gpu")
  list(APPEND want place_only)
else()
  string(FIND "${out}" "place_only: gfd's placing kernel needs a GPU: skipped" at)
  if(at LESS 0)
    message(FATAL_ERROR "host-only without the place_only notice:\n${out}")
  endif()
endif()
foreach(direction h2d d2h)
  foreach(method IN LISTS want)
    list(FIND seen "${direction}:${method}" at)
    if(at LESS 0)
      message(FATAL_ERROR "no ${direction} ${method} row:\n${lines}")
    endif()
  endforeach()
endforeach()

# Without --methods, the stages are not measured.
execute_process(COMMAND ${BENCH} --layout paged --quick --direction h2d --csv ${WORK_DIR}/default.csv
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${WORK_DIR}/default.csv" rows)
if(NOT rc EQUAL 0 OR rows MATCHES ",(gather_only|place_only),")
  message(FATAL_ERROR "the default run (status ${rc}) measured a stage:\n${rows}\n${out}\n${err}")
endif()
message(STATUS "gfd_benchmark --layout paged stages (${mode}): ${seen}")
