# gfd_add_test(name SOURCES ...): a GoogleTest executable registered with CTest, one CTest
# test per GoogleTest case.
function(gfd_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE gfd_internal gfd_test_support GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES TIMEOUT 600)
endfunction()

# gfd_add_bench(name SOURCES ...): a benchmark program.
function(gfd_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE gfd_internal)
endfunction()
