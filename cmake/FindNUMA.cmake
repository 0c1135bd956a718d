# Finds libnuma and defines the imported target NUMA::NUMA.
#
# Components: `library` (libnuma itself) and `headers` (numa.h). Without COMPONENTS both are
# required, as building gfd needs them. gfd's package config asks for the library only, and only
# when libgfd is static: a static libgfd must be linked with libnuma, but no public header of gfd
# includes numa.h, so a consuming machine needs no libnuma headers.
set(_gfd_numa_headers TRUE)
if(NUMA_FIND_COMPONENTS)
  foreach(_gfd_numa_c IN LISTS NUMA_FIND_COMPONENTS)
    if(NOT _gfd_numa_c MATCHES "^(library|headers)$")
      message(FATAL_ERROR "FindNUMA: unknown component '${_gfd_numa_c}' (known: library, headers)")
    endif()
  endforeach()
  if(NOT "headers" IN_LIST NUMA_FIND_COMPONENTS)
    set(_gfd_numa_headers FALSE)
  endif()
endif()

find_library(NUMA_LIBRARY numa)
set(_gfd_numa_vars NUMA_LIBRARY)
if(_gfd_numa_headers)
  find_path(NUMA_INCLUDE_DIR numa.h)
  list(APPEND _gfd_numa_vars NUMA_INCLUDE_DIR)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NUMA REQUIRED_VARS ${_gfd_numa_vars})
if(NUMA_FOUND AND NOT TARGET NUMA::NUMA)
  add_library(NUMA::NUMA UNKNOWN IMPORTED)
  set_target_properties(NUMA::NUMA PROPERTIES IMPORTED_LOCATION "${NUMA_LIBRARY}")
  if(_gfd_numa_headers)
    set_target_properties(NUMA::NUMA PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${NUMA_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(NUMA_INCLUDE_DIR NUMA_LIBRARY)
unset(_gfd_numa_headers)
unset(_gfd_numa_vars)
