# The pure libraries (planner, verifier, advisor, the generated messages, the
# dataset share function, common's basics) link no gRPC: reads the link
# closures that tests/configure/CMakeLists.txt wrote at configure time, a line
# "<library> <linked item>" each, and fails naming every library whose closure
# holds gRPC or reshard_proto (the generated services).
# Run as: cmake -DCLOSURES=<file> -P no_grpc.cmake
file(STRINGS "${CLOSURES}" lines)
set(libraries "")
set(found "")
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^([^ ]+) (.*)$")
    continue()
  endif()
  set(library "${CMAKE_MATCH_1}")
  set(item "${CMAKE_MATCH_2}")
  list(APPEND libraries "${library}")
  string(TOLOWER "${item}" lower)
  if(lower MATCHES "grpc" OR item STREQUAL "reshard_proto")
    string(APPEND found "\n  ${library} links ${item}")
  endif()
endforeach()
if(NOT libraries)
  message(FATAL_ERROR "${CLOSURES} names no library")
endif()
if(found)
  message(FATAL_ERROR "libraries that must not speak gRPC link it:${found}")
endif()
list(REMOVE_DUPLICATES libraries)
list(LENGTH libraries n)
message(STATUS "${n} pure libraries link no gRPC: ${libraries}")
