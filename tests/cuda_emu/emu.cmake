# The CUDA backend on the emulated CUDA runtime (tests/cuda_emu/README.md): each src/**/*.cu file is translated by
# cu2cpp (kernel launches and __shared__ declarations only; line numbers kept) and compiled as host C++ against the
# emulator's headers, which stand where the toolkit's would; libsnug_cuda_emu.so is the runtime, libcublasLt.so.0 the
# stand-in cuBLASLt the backend opens from this build's folder, libsnug_nccl_emu.so the stand-in NCCL (the
# tests name it in SNUG_NCCL: a real libnccl.so.2 on the loader's path would otherwise come first). Needs no CUDA
# toolkit. Included by CMakeLists.txt when SNUG_CUDA_EMU is on (by default in the sanitizer build).
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(SNUG_EMU_DIR ${CMAKE_SOURCE_DIR}/tests/cuda_emu)

add_executable(snug_cu2cpp ${SNUG_EMU_DIR}/cu2cpp.c)
set_target_properties(snug_cu2cpp PROPERTIES COMPILE_OPTIONS "" LINK_OPTIONS "")
target_compile_options(snug_cu2cpp PRIVATE -fno-sanitize=all)
target_link_options(snug_cu2cpp PRIVATE -fno-sanitize=all)

add_library(snug_cuda_emu SHARED ${SNUG_EMU_DIR}/runtime.cpp)
target_include_directories(snug_cuda_emu PUBLIC ${SNUG_EMU_DIR}/include)
target_compile_options(snug_cuda_emu PRIVATE -ffp-contract=off)
target_compile_definitions(snug_cuda_emu PRIVATE
  SNUG_EMU_RESOURCES="${SNUG_EMU_DIR}/kernel_resources.tsv")
target_link_libraries(snug_cuda_emu PRIVATE Threads::Threads)

add_library(snug_cublaslt_emu SHARED ${SNUG_EMU_DIR}/cublaslt_emu.c)
set_target_properties(snug_cublaslt_emu PROPERTIES OUTPUT_NAME cublasLt SUFFIX ".so.0" NO_SONAME ON)
target_link_libraries(snug_cublaslt_emu PRIVATE snug_cuda_emu ${MATH_LIB})
# The stand-in checks every operand's extent itself; its loops run uninstrumented and optimised (they are most of an
# emulated training step's time), their sums in the same fixed order.
target_compile_options(snug_cublaslt_emu PRIVATE -O3 -fno-sanitize=address)

file(GLOB SNUG_EMU_CU CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu ${CMAKE_SOURCE_DIR}/src/dist/*.cu)
set(SNUG_EMU_CPP)
foreach(cu ${SNUG_EMU_CU})
  get_filename_component(name ${cu} NAME_WE)
  set(cpp ${CMAKE_BINARY_DIR}/cuda_emu/${name}.cpp)
  add_custom_command(OUTPUT ${cpp} COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/cuda_emu
    COMMAND snug_cu2cpp ${cu} ${cpp} DEPENDS ${cu} snug_cu2cpp COMMENT "cu2cpp ${name}.cu" VERBATIM)
  list(APPEND SNUG_EMU_CPP ${cpp})
endforeach()
# The kernels' arithmetic as written: no product fused into a sum unless the source asks (as the C code does).
set_source_files_properties(${SNUG_EMU_CPP} PROPERTIES COMPILE_OPTIONS
  "-ffp-contract=off;-Wno-unused-function;-Wno-unknown-pragmas;-Wno-sign-compare")
set(SNUG_NCCL_SOURCES ${CMAKE_SOURCE_DIR}/src/dist/comm_nccl.c ${CMAKE_SOURCE_DIR}/src/dist/comm_nccl_lib.c)
target_sources(snug_lib PRIVATE ${SNUG_EMU_CPP} ${SNUG_NCCL_SOURCES})
target_include_directories(snug_lib BEFORE PUBLIC ${SNUG_EMU_DIR}/include)
target_compile_definitions(snug_lib PUBLIC SNUG_HAVE_CUDA SNUG_CUDA_EMU)
set_source_files_properties(${CMAKE_BINARY_DIR}/cuda_emu/backend_cuda.cpp PROPERTIES
  COMPILE_DEFINITIONS "SNUG_CUDA_LIBDIR=\"$<TARGET_FILE_DIR:snug_cublaslt_emu>\"")
add_dependencies(snug_lib snug_cublaslt_emu)
target_link_libraries(snug_lib PUBLIC snug_cuda_emu ${CMAKE_DL_LIBS})

add_library(snug_nccl_emu SHARED ${SNUG_EMU_DIR}/nccl_emu.c)
target_link_libraries(snug_nccl_emu PRIVATE snug_cuda_emu Threads::Threads rt)
set_source_files_properties(${SNUG_NCCL_SOURCES} PROPERTIES
  COMPILE_DEFINITIONS "SNUG_NCCL_PATH=\"$<TARGET_FILE:snug_nccl_emu>\"")
add_dependencies(snug_lib snug_nccl_emu)
message(STATUS "CUDA backend: on the emulated runtime (tests/cuda_emu; no GPU code is compiled)")
