# gfd_add_test(file): the GoogleTest file `file` (e.g. planner_test.cpp) as an executable named
# after it (gfd_planner_test), registered with CTest, one CTest test per GoogleTest case, named by
# the suites' name generators (NO_PRETTY_VALUES: no "# GetParam() = ..." dump of the parameter's
# bytes in the name).
function(gfd_add_test file)
  get_filename_component(stem ${file} NAME_WE)
  set(name gfd_${stem})
  add_executable(${name} ${file})
  target_link_libraries(${name} PRIVATE gfd_testkit gfd_test_support GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST NO_PRETTY_VALUES PROPERTIES TIMEOUT 600)
endfunction()

# gfd_add_bench(name [INTERNAL] SOURCES ...): a benchmark program. By default it sees gfd's
# public API and src/testkit/testkit.hpp only (bench/); INTERNAL gives it every internal header, for the
# microbenchmarks of internals in bench/micro/.
function(gfd_add_bench name)
  cmake_parse_arguments(ARG "INTERNAL" "" "SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  if(ARG_INTERNAL)
    target_link_libraries(${name} PRIVATE gfd_testkit)
  else()
    target_link_libraries(${name} PRIVATE gfd_testkit_api)
  endif()
endfunction()
