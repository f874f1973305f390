# Where reshard's CUDA code (agent/device/cuda_libraries.cc)
# will find the CUDA runtime and NCCL at run time. Nothing is linked and no
# CUDA header is needed: the code declares the few C entry points it calls
# (agent/device/cuda_api.h) and loads libcudart and libnccl with dlopen, so
# the binaries start on hosts without them. The directories found here are
# searched first (after $RESHARD_CUDA_LIBRARY_PATH).
#
# Looked for, in order: a CUDA toolkit (find_package(CUDAToolkit),
# CUDAToolkit_ROOT, /usr/local/cuda), then the wheels that PyTorch's CUDA
# build brings into the project's venv (scripts/bootstrap.sh makes it before
# the build configures): site-packages/nvidia/cu13/lib/libcudart.so.13 (or
# nvidia/cuda_runtime/lib for CUDA 12) and nvidia/nccl/lib/libnccl.so.2.
# No nvcc is needed.
#
# Sets RESHARD_CUDA_LIBRARY_DIRS, RESHARD_CUDA_FOUND (both libraries found)
# and RESHARD_CUDA_MISSING (what is not, for a message).

function(reshard_find_cuda venv_python)
  set(hints "")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    list(APPEND hints ${CUDAToolkit_LIBRARY_DIR})
  endif()
  list(APPEND hints /usr/local/cuda/lib64)
  # The venv's site-packages, asked of its python (lib/python3.X differs).
  if(EXISTS "${venv_python}")
    execute_process(COMMAND ${venv_python} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
      OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND IS_DIRECTORY "${site}/nvidia")
      foreach(sub cu13 cuda_runtime nccl)
        list(APPEND hints "${site}/nvidia/${sub}/lib")
      endforeach()
    endif()
  endif()
  set(dirs "")
  set(cudart "")
  set(nccl "")
  foreach(dir ${hints})
    # Wheels hold only versioned names (libcudart.so.13, libnccl.so.2).
    file(GLOB cudart_here "${dir}/libcudart.so.1[23]" "${dir}/libcudart.so")
    file(GLOB nccl_here "${dir}/libnccl.so.2" "${dir}/libnccl.so")
    if(cudart_here OR nccl_here)
      list(APPEND dirs "${dir}")
    endif()
    list(APPEND cudart ${cudart_here})
    list(APPEND nccl ${nccl_here})
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  set(missing "")
  if(NOT cudart)
    list(APPEND missing "libcudart.so.13 (or .12)")
  endif()
  if(NOT nccl)
    list(APPEND missing "libnccl.so.2")
  endif()
  if(missing)
    set(RESHARD_CUDA_FOUND OFF PARENT_SCOPE)
  else()
    set(RESHARD_CUDA_FOUND ON PARENT_SCOPE)
  endif()
  string(REPLACE ";" " and " missing "${missing}")
  set(RESHARD_CUDA_MISSING "${missing}" PARENT_SCOPE)
  set(RESHARD_CUDA_LIBRARY_DIRS "${dirs}" PARENT_SCOPE)
endfunction()
