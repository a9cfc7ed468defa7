# The ctest suite. Every tests/unit/test_*.c is one executable and one test. Python parity tests (tests/parity)
# need a virtual environment with torch and transformers; scripts/venv.sh makes it and the tests find it through
# SNUG_VENV.
# Under the sanitizers LeakSanitizer cannot read the TLS of the threads once oneDNN is loaded (see
# tests/unit/lsan-dnnl.supp), so there every test but test_cpu_gemm's keeps bf16 runs on OpenBLAS (SNUG_CPU_GEMM),
# and test_cpu_gemm's run with the TLS unscanned and glibc's and libgomp's per-thread state suppressed.
# OMP_WAIT_POLICY=PASSIVE: ctest runs two tests at once on two cores, each with two OpenMP threads; threads that spin
# at a barrier while another test holds the core made a 10-step bf16 run take 24 s instead of 2-3 s (libgomp's
# default spin, 2 vCPUs, one other job running). Waiting threads sleep instead; no result depends on it.
set(SNUG_OMP_TEST_ENV "OMP_WAIT_POLICY=PASSIVE")
set(SNUG_TEST_ENV "SNUG_BIN=$<TARGET_FILE:snug>;SNUG_SOURCE_DIR=${CMAKE_SOURCE_DIR};OMP_NUM_THREADS=2;${SNUG_OMP_TEST_ENV}")
set(SNUG_DNNL_TEST_ENV "${SNUG_TEST_ENV}")
if(SNUG_SANITIZE)
  list(APPEND SNUG_DNNL_TEST_ENV "LSAN_OPTIONS=use_tls=0:suppressions=${CMAKE_SOURCE_DIR}/tests/unit/lsan-dnnl.supp")
  set(SNUG_NO_DNNL_ENV "SNUG_CPU_GEMM=openblas")
endif()
file(GLOB SNUG_UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/unit/test_*.c)
foreach(src ${SNUG_UNIT_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src} ${CMAKE_SOURCE_DIR}/tests/unit/check.c)
  target_link_libraries(${name} PRIVATE snug_cli)
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${SNUG_TEST_ENV};${SNUG_NO_DNNL_ENV}" LABELS unit)
endforeach()
# The CPU's oneDNN GEMM path with f32 and with bf16 operands: skipped (exit 77) where this build, library or CPU has
# no fast matmul of that type (bf16 needs AVX-512 BF16 or AMX); test_cpu_gemm itself is the choice and OpenBLAS.
set_tests_properties(test_cpu_gemm PROPERTIES ENVIRONMENT "${SNUG_DNNL_TEST_ENV}")
foreach(dt f32 bf16)
  add_test(NAME test_cpu_gemm_${dt} COMMAND test_cpu_gemm ${dt} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(test_cpu_gemm_${dt} PROPERTIES ENVIRONMENT "${SNUG_DNNL_TEST_ENV}" SKIP_RETURN_CODE 77
    LABELS unit)
endforeach()
# The CUDA backend against the CPU's: skipped (exit 77) without a CUDA build or a GPU; `ctest -L cuda` runs it.
set_tests_properties(test_cuda_ops PROPERTIES SKIP_RETURN_CODE 77 LABELS "unit;cuda")
# The NCCL communicator at one rank on a GPU against comm_self: skipped (exit 77) the same way; scripts/gpu-check.sh
# runs it in its own stage (`ctest -L nccl`).
set_tests_properties(test_comm_nccl PROPERTIES SKIP_RETURN_CODE 77 LABELS "unit;cuda;nccl")
# Joining the NCCL communicator within dist_timeout, against a stand-in NCCL library (tests/unit/fake_nccl.c)
# whose join hangs, fails or succeeds: skipped (77) without a CUDA build or a GPU.
add_library(snug_fake_nccl SHARED ${CMAKE_SOURCE_DIR}/tests/unit/fake_nccl.c)
target_compile_definitions(test_nccl_join PRIVATE SNUG_FAKE_NCCL="$<TARGET_FILE:snug_fake_nccl>")
add_dependencies(test_nccl_join snug_fake_nccl)
set_tests_properties(test_nccl_join PROPERTIES SKIP_RETURN_CODE 77 LABELS "unit;cuda;nccl")

file(GLOB SNUG_SHELL_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cli/test_*.sh)
foreach(src ${SNUG_SHELL_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME cli_${name} COMMAND bash ${src} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  # SNUG_SANITIZED: the sanitizer build, where a test may run fewer configurations of the same checks
  set_tests_properties(cli_${name} PROPERTIES ENVIRONMENT
    "SNUG_BIN=$<TARGET_FILE:snug>;SNUG_SOURCE_DIR=${CMAKE_SOURCE_DIR};SNUG_SANITIZED=$<BOOL:${SNUG_SANITIZE}>;${SNUG_NO_DNNL_ENV};${SNUG_OMP_TEST_ENV}"
    LABELS cli)
endforeach()

set(SNUG_VENV "$ENV{HOME}/.cache/snug/venv" CACHE PATH "virtual environment with torch, transformers, safetensors")
file(GLOB SNUG_PARITY_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/parity/test_*.py)
foreach(src ${SNUG_PARITY_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME parity_${name} COMMAND ${SNUG_VENV}/bin/python ${src} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(parity_${name} PROPERTIES ENVIRONMENT "SNUG_BIN=$<TARGET_FILE:snug>;SNUG_SOURCE_DIR=${CMAKE_SOURCE_DIR};OMP_NUM_THREADS=2;${SNUG_OMP_TEST_ENV}" LABELS parity TIMEOUT 1200
    SKIP_RETURN_CODE 77)
endforeach()
# The CUDA backend end to end against the CPU's (tests/cli/test_cuda_train.sh): skipped (exit 77) without a GPU.
set_tests_properties(cli_test_cuda_train PROPERTIES SKIP_RETURN_CODE 77 LABELS "cli;cuda")
# Its NCCL part alone (`test_cuda_train.sh nccl`): one rank through the NCCL communicator against the same run without.
add_test(NAME cli_test_cuda_train_nccl COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/test_cuda_train.sh nccl
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(cli_test_cuda_train_nccl PROPERTIES ENVIRONMENT
  "SNUG_BIN=$<TARGET_FILE:snug>;SNUG_SOURCE_DIR=${CMAKE_SOURCE_DIR};SNUG_SANITIZED=$<BOOL:${SNUG_SANITIZE}>;${SNUG_NO_DNNL_ENV};${SNUG_OMP_TEST_ENV}"
  SKIP_RETURN_CODE 77
  LABELS "cli;cuda;nccl")
# Data parallel over MPI ranks (tests/cli/test_ddp.sh): skipped (exit 77) without mpirun or an MPI build.
set_tests_properties(cli_test_ddp PROPERTIES SKIP_RETURN_CODE 77)
# ZeRO over MPI ranks against DDP (tests/cli/test_zero.sh): skipped (exit 77) the same way.
set_tests_properties(cli_test_zero PROPERTIES SKIP_RETURN_CODE 77)
# Tensor parallelism over MPI ranks against one process (tests/cli/test_tp.sh): skipped (exit 77) the same way.
set_tests_properties(cli_test_tp PROPERTIES SKIP_RETURN_CODE 77)
# Pipeline parallelism over MPI ranks against one process (tests/cli/test_pp.sh): skipped (exit 77) the same way.
set_tests_properties(cli_test_pp PROPERTIES SKIP_RETURN_CODE 77)
# The MPI communicator's own checks (tests/dist/test_comm_mpi.c), run under mpirun by test_ddp.sh.
if(TARGET MPI::MPI_C)
  add_executable(test_comm_mpi ${CMAKE_SOURCE_DIR}/tests/dist/test_comm_mpi.c)
  target_link_libraries(test_comm_mpi PRIVATE snug_lib)
  set_property(TEST cli_test_ddp APPEND PROPERTY ENVIRONMENT "SNUG_COMM_TEST=$<TARGET_FILE:test_comm_mpi>")
endif()
# The CUDA kernels' registers, stack frames, spills and shared memory against tests/cuda_emu/kernel_resources.tsv
# (tests/cli/test_cuda_resources.sh), read from libsnug.a with no GPU: skipped (exit 77) in a build without the CUDA
# backend (the sanitizer build) or without cuobjdump (scripts/venv.sh installs nvidia-cuda-cuobjdump).
set_tests_properties(cli_test_cuda_resources PROPERTIES SKIP_RETURN_CODE 77)
set_property(TEST cli_test_cuda_resources APPEND PROPERTY ENVIRONMENT "SNUG_VENV=${SNUG_VENV}")
# The longest tests first (ctest runs the highest COST first when it has no timings of its own, as in a fresh
# clone), so that none of them runs alone at the end while the other core idles: about 300-600 s each under the
# sanitizers on 2 cores. The emulated CUDA suite's are set in tests/cuda_emu/emu_tests.cmake.
set_tests_properties(cli_test_zero PROPERTIES COST 950)
set_tests_properties(cli_test_resume PROPERTIES COST 850)
set_tests_properties(cli_test_pp PROPERTIES COST 700)
set_tests_properties(cli_test_tp PROPERTIES COST 600)
# The CUDA tests on the emulated CUDA runtime, in the build that has it (SNUG_CUDA_EMU: the sanitizer build).
if(SNUG_CUDA_EMU)
  include(${CMAKE_SOURCE_DIR}/tests/cuda_emu/emu_tests.cmake)
endif()
