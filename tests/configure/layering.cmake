# The folders tell the layers: product code includes nothing from a layer it
# must not depend on. Each rule is "<folder>:<include prefix>"; a file under
# <folder> with `#include "<prefix>...` fails the check. The coordinator and
# the agent never include the client (what both sides share lives in common/),
# common/ includes no component, the planner, verifier and advisor include no
# service, agent or client (the verifier not the planner either: it checks the
# planner independently), and the client includes no service or agent. In the
# agent, the device API (agent/device) includes no other agent part and the
# shard store neither the transfer backends nor the executor.
# Run as: cmake -DSOURCE_DIR=<root> -P layering.cmake
cmake_policy(SET CMP0009 NEW)
set(rules
  services:client/ agent:client/
  common:client/ common:services/ common:agent/ common:planner/
  planner:services/ planner:agent/ planner:client/
  verifier:services/ verifier:agent/ verifier:client/ verifier:planner/
  advisor:services/ advisor:agent/ advisor:client/
  client:services/ client:agent/
  agent/device:agent/shard_store/ agent/device:agent/transfer/ agent/device:agent/executor/
  agent/shard_store:agent/transfer/ agent/shard_store:agent/executor/)
set(found "")
foreach(rule IN LISTS rules)
  string(REPLACE ":" ";" parts "${rule}")
  list(GET parts 0 dir)
  list(GET parts 1 prefix)
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${SOURCE_DIR}"
    "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.cc")
  foreach(f IN LISTS files)
    file(STRINGS "${SOURCE_DIR}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"${prefix}")
    foreach(line IN LISTS lines)
      string(APPEND found "\n  ${f} (${dir}/ must not include ${prefix}): ${line}")
    endforeach()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "includes across the layers:${found}")
endif()
list(LENGTH rules n)
message(STATUS "${n} layering rules hold")
