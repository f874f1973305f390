# cmake -P script: configures SOURCE_DIR into BINARY_DIR with -DRESHARD_CUDA=OFF,
# builds reshard_transfer, reshard-agent and the registry's and the fake
# device's tests, checks that the agent needs neither libcudart nor libnccl,
# and runs those tests.
# Any failure is a fatal error (non-zero exit). Uses LAUNCHER (e.g. ccache)
# when the main build has one, else ccache when it is on PATH, else nothing.
foreach(var SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER)
  if(NOT ${var})
    message(FATAL_ERROR "cuda_off_build: ${var} is not set")
  endif()
endforeach()

set(launcher "${LAUNCHER}")
if(NOT launcher)
  find_program(CCACHE ccache)
  if(CCACHE)
    set(launcher "${CCACHE}")
  endif()
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cuda_off_build: ${what} failed (${rc})")
  endif()
endfunction()

run(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR}
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  -DCMAKE_CXX_COMPILER_LAUNCHER=${launcher} -DRESHARD_PYTHON=${PYTHON} -DRESHARD_CUDA=OFF)

file(STRINGS ${BINARY_DIR}/CMakeCache.txt have_cuda REGEX "^RESHARD_CUDA:")
if(NOT have_cuda STREQUAL "RESHARD_CUDA:STRING=OFF")
  message(FATAL_ERROR "cuda_off_build: the cache says ${have_cuda}")
endif()

run(build ${CMAKE_COMMAND} --build ${BINARY_DIR} -j2
  --target reshard_transfer reshard-agent transfer_backend_test
  transfer_fake_device_test shard_store_device_test)

set(agent ${BINARY_DIR}/agent/process/reshard-agent)
execute_process(COMMAND readelf -d ${agent} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cuda_off_build: readelf -d ${agent} failed (${rc})")
endif()
if(dynamic MATCHES "libcudart|libnccl")
  message(FATAL_ERROR "cuda_off_build: ${agent} needs CUDA or NCCL:\n${dynamic}")
endif()

# Built without CUDA: the registry lists no "nccl" (backend_test checks the
# build's configuration).
run("transfer_backend_test" ${BINARY_DIR}/tests/agent/transfer/transfer_backend_test)
# The device API without CUDA: the fake device only ("cuda" is refused).
run("transfer_fake_device_test" ${BINARY_DIR}/tests/agent/transfer/transfer_fake_device_test)
run("shard_store_device_test" ${BINARY_DIR}/tests/agent/shard_store/shard_store_device_test)
message(STATUS "cuda_off_build: configured and built with RESHARD_CUDA=OFF")
