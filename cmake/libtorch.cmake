# LibTorch for spanformer: the one place that knows how LibTorch builds differ in CMake (the C++
# differences live in include/spanformer/util/torch_compat.h).
#
# Three LibTorch builds are in use:
#   1. PyPI's torch wheel (2.x, the default: scripts/install-deps.sh puts it in .venv). On Linux it is a
#      CUDA build (libtorch_cuda.so, the nvidia-* wheels beside it) whose TorchConfig.cmake insists on a
#      CUDA toolkit and links the CUDA runtime into everything.
#   2. Debian's libtorch-dev 1.13 (CPU only).
#   3. Any other LibTorch (the GPU machine's PyTorch, a source build, a CPU-only libtorch zip).
#
# With SPANFORMER_CUDA=ON, LibTorch's own TorchConfig.cmake is used as it is. A CPU build (the default)
# of a CUDA LibTorch imports only its CPU libraries (libtorch_cpu, libc10) with the include directories,
# compile definitions and language standard its config declares: it then needs no CUDA toolkit, and a
# laptop builds spanformer against the same wheel a GPU cluster uses. A CPU LibTorch goes through
# TorchConfig.cmake as before.
#
# Where LibTorch is looked for: CMAKE_PREFIX_PATH / Torch_DIR as for find_package (the torch package's
# directory, `python -c "import torch, os; print(os.path.dirname(torch.__file__))"`, or its
# share/cmake), then the system (Debian's /usr). Sets TORCH_LIBRARIES (link this), TORCH_INCLUDE_DIRS,
# TORCH_INSTALL_PREFIX, SPANFORMER_TORCH_VERSION, SPANFORMER_TORCH_HAS_CUDA (the LibTorch has CUDA
# libraries, whether or not this build uses them) and SPANFORMER_PYTHON_EXECUTABLE (the Python whose
# torch it is).

find_file(SPANFORMER_TORCH_CONFIG TorchConfig.cmake
  HINTS ${Torch_DIR}
  # a LibTorch prefix, its share/cmake, a site-packages folder (scikit-build-core's prefix), Debian's /usr
  PATH_SUFFIXES share/cmake/Torch cmake/Torch Torch torch/share/cmake/Torch lib/cmake/Torch
                lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch
  DOC "TorchConfig.cmake of the LibTorch spanformer builds against")
if(NOT SPANFORMER_TORCH_CONFIG)
  message(FATAL_ERROR "LibTorch not found: run scripts/install-deps.sh (PyPI's torch in .venv), then configure "
          "with -DCMAKE_PREFIX_PATH=\"$(.venv/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))')\" "
          "(scripts/build.sh does), or install Debian's libtorch-dev")
endif()
get_filename_component(_sf_torch_config_dir "${SPANFORMER_TORCH_CONFIG}" DIRECTORY)
set(SPANFORMER_TORCH_CONFIG_DIR "${_sf_torch_config_dir}")
# TorchConfig.cmake's own rule: the prefix is three levels above it (share/cmake/Torch). Debian's sits
# in lib/<arch>/cmake/Torch, four levels down: its headers are found in /usr/include either way.
get_filename_component(_sf_torch_prefix "${_sf_torch_config_dir}/../../.." ABSOLUTE)
find_library(_sf_torch_cuda_lib torch_cuda PATHS "${_sf_torch_prefix}/lib" NO_DEFAULT_PATH NO_CACHE)
if(TARGET spanformer_libtorch_cpu OR TARGET torch)
  return()  # imported already (a consumer's second find_package(spanformer))
endif()
if(_sf_torch_cuda_lib)
  set(SPANFORMER_TORCH_HAS_CUDA ON)
else()
  set(SPANFORMER_TORCH_HAS_CUDA OFF)
endif()

if(SPANFORMER_CUDA OR NOT SPANFORMER_TORCH_HAS_CUDA)
  if(SPANFORMER_CUDA AND NOT SPANFORMER_TORCH_HAS_CUDA)
    message(FATAL_ERROR "SPANFORMER_CUDA=ON needs a LibTorch with CUDA; ${_sf_torch_prefix} has no libtorch_cuda")
  endif()
  # LibTorch's config compiles CUDA code for the architectures in TORCH_CUDA_ARCH_LIST, else for every
  # common one from 5.0 on: the tensor-core kernels need 8.0 and later, and one target builds much faster.
  # The default is Hopper (H100 / H200), the GPUs measured; set it for others ("8.0;9.0").
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  # Full prefix first, so that TorchConfig.cmake's find_library calls land in this LibTorch and not in
  # another one on the system (Debian's /usr/lib holds a libtorch.so too).
  list(PREPEND CMAKE_PREFIX_PATH "${_sf_torch_prefix}")
  find_package(Torch REQUIRED CONFIG PATHS "${_sf_torch_config_dir}" NO_DEFAULT_PATH)
  # PyPI's CUDA LibTorch loads the CUDA libraries of the nvidia-* wheels beside it (NCCL, cuBLAS, the
  # runtime), which may be newer than the CUDA toolkit's: link against those (libtorch_cuda needs their
  # symbols) and load them first at run time.
  file(GLOB _sf_nvidia_lib_dirs LIST_DIRECTORIES true "${_sf_torch_prefix}/../nvidia/*/lib")
  if(_sf_nvidia_lib_dirs)
    add_library(spanformer_libtorch_cuda_paths INTERFACE IMPORTED)
    foreach(_sf_dir ${_sf_nvidia_lib_dirs})
      get_filename_component(_sf_dir "${_sf_dir}" REALPATH)
      set_property(TARGET spanformer_libtorch_cuda_paths APPEND PROPERTY INTERFACE_LINK_OPTIONS
                   "LINKER:-rpath-link,${_sf_dir}" "LINKER:-rpath,${_sf_dir}")
    endforeach()
    list(APPEND TORCH_LIBRARIES spanformer_libtorch_cuda_paths)
  endif()
  get_filename_component(_sf_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  get_filename_component(_sf_torch_lib_dir "${_sf_torch_lib_dir}" REALPATH)
  get_filename_component(_sf_torch_prefix_real "${TORCH_INSTALL_PREFIX}" REALPATH)
  if(NOT _sf_torch_lib_dir MATCHES "^${_sf_torch_prefix_real}" AND NOT _sf_torch_prefix_real STREQUAL "/usr")
    message(FATAL_ERROR "LibTorch's config (${SPANFORMER_TORCH_CONFIG}) found a libtorch outside it "
            "(${TORCH_LIBRARY}): two LibTorch installations are mixed; give -DCMAKE_PREFIX_PATH=<torch dir>")
  endif()
else()
  # A CPU build of a CUDA LibTorch: its CPU half only.
  set(TORCH_INSTALL_PREFIX "${_sf_torch_prefix}")
  set(TORCH_INCLUDE_DIRS "${_sf_torch_prefix}/include" "${_sf_torch_prefix}/include/torch/csrc/api/include")
  set(_sf_torch_libs)
  foreach(_sf_lib torch_cpu c10)
    find_library(_sf_torch_${_sf_lib} ${_sf_lib} PATHS "${_sf_torch_prefix}/lib" NO_DEFAULT_PATH NO_CACHE REQUIRED)
    list(APPEND _sf_torch_libs "${_sf_torch_${_sf_lib}}")
  endforeach()
  # What torch_cpu's imported target declares (USE_DISTRIBUTED, USE_C10D_GLOO, ...): the headers test them.
  file(READ "${_sf_torch_prefix}/share/cmake/Caffe2/Caffe2Targets.cmake" _sf_targets)
  string(REGEX MATCH "add_library\\(torch_cpu SHARED IMPORTED\\)[^)]*INTERFACE_COMPILE_DEFINITIONS \"([^\"]*)\"" _ "${_sf_targets}")
  set(_sf_torch_defs "${CMAKE_MATCH_1}")
  add_library(spanformer_libtorch_cpu INTERFACE IMPORTED)
  set_target_properties(spanformer_libtorch_cpu PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${_sf_torch_libs}"
    INTERFACE_COMPILE_DEFINITIONS "${_sf_torch_defs}")
  # LibTorch 2.10 and later need C++20 (their TorchConfig.cmake says so); older ones C++17.
  file(READ "${SPANFORMER_TORCH_CONFIG}" _sf_torch_config_text)
  if(_sf_torch_config_text MATCHES "cxx_std_20")
    target_compile_features(spanformer_libtorch_cpu INTERFACE cxx_std_20)
  endif()
  set(TORCH_LIBRARIES spanformer_libtorch_cpu)
  set(Torch_FOUND TRUE)
endif()

# Where its libraries are, for the installed programs' run path (none needed for the system's /usr).
set(SPANFORMER_TORCH_LIB_DIR "")
if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libc10.so" AND NOT TORCH_INSTALL_PREFIX STREQUAL "/usr")
  set(SPANFORMER_TORCH_LIB_DIR "${TORCH_INSTALL_PREFIX}/lib")
endif()

# The Python whose torch this LibTorch is: the tests load the operator module into it. A torch package in
# a virtual environment (.../lib/pythonX.Y/site-packages/torch) has its bin/python; Debian's LibTorch
# goes with Debian's python3 and python3-torch.
if(NOT SPANFORMER_PYTHON_EXECUTABLE)
  set(SPANFORMER_PYTHON_EXECUTABLE /usr/bin/python3)
  if(_sf_torch_prefix MATCHES "^(.*)/lib/python3[^/]*/site-packages/torch$")
    if(EXISTS "${CMAKE_MATCH_1}/bin/python")
      set(SPANFORMER_PYTHON_EXECUTABLE "${CMAKE_MATCH_1}/bin/python")
    endif()
  endif()
endif()
set(SPANFORMER_PYTHON_EXECUTABLE "${SPANFORMER_PYTHON_EXECUTABLE}" CACHE FILEPATH "the Python with this LibTorch's torch (tests)")

# The version, as the config's version file gives it.
file(STRINGS "${_sf_torch_config_dir}/TorchConfigVersion.cmake" _sf_version_line REGEX "set\\(PACKAGE_VERSION \"")
string(REGEX MATCH "\"([^\"]+)\"" _ "${_sf_version_line}")
set(SPANFORMER_TORCH_VERSION "${CMAKE_MATCH_1}")
message(STATUS "LibTorch ${SPANFORMER_TORCH_VERSION} at ${TORCH_INSTALL_PREFIX} (CUDA libraries: "
               "${SPANFORMER_TORCH_HAS_CUDA}; used by this build: ${SPANFORMER_CUDA})")
