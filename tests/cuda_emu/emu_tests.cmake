# The tests on the emulated CUDA runtime (SNUG_CUDA_EMU; included by tests/tests.cmake): the emulator's own
# (test_emu), and every CUDA test of the suite with one emulated device. Each process appends the kernels it ran to
# cuda_emu_coverage.txt; cuda_emu_coverage, run after them, fails when a kernel of the real build never ran.
set(SNUG_EMU_TEST_CPP ${CMAKE_BINARY_DIR}/cuda_emu/test_emu.cpp)
add_custom_command(OUTPUT ${SNUG_EMU_TEST_CPP} COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/cuda_emu
  COMMAND snug_cu2cpp ${SNUG_EMU_DIR}/test_emu.cu ${SNUG_EMU_TEST_CPP} DEPENDS ${SNUG_EMU_DIR}/test_emu.cu snug_cu2cpp
  VERBATIM)
add_executable(test_emu ${SNUG_EMU_TEST_CPP})
set_source_files_properties(${SNUG_EMU_TEST_CPP} PROPERTIES COMPILE_OPTIONS "-ffp-contract=off;-Wno-unknown-pragmas")
target_link_libraries(test_emu PRIVATE snug_cuda_emu)
add_test(NAME test_emu COMMAND test_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})

set(SNUG_EMU_COVERAGE ${CMAKE_BINARY_DIR}/cuda_emu_coverage.txt)
set(SNUG_EMU_ENV "SNUG_CUDA_EMU_COVERAGE=${SNUG_EMU_COVERAGE}")
# the GEMMs again with the stand-in cuBLASLt refusing the bias epilogue and the fast 16-bit compute types: the
# backend's fallbacks (the bias written first, exact fp32) against the same references
add_test(NAME test_cuda_ops_lt_fallback COMMAND test_cuda_ops gemm WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(test_cuda_ops_lt_fallback PROPERTIES
  ENVIRONMENT "${SNUG_TEST_ENV};${SNUG_NO_DNNL_ENV};SNUG_CUDA_EMU_LT=bias,fast16" LABELS "unit;cuda")
set(SNUG_EMU_TESTS test_emu test_cuda_ops test_cuda_ops_lt_fallback test_comm_nccl test_nccl_join cli_test_cuda_train
  cli_test_cuda_train_nccl)
foreach(t ${SNUG_EMU_TESTS})
  set(devices 1)
  if(t STREQUAL cli_test_cuda_train_nccl)
    set(devices 3) # NCCL's part: its ranks under mpirun (DDP, ZeRO, tensor parallelism at 2; ZeRO at 3)
  endif()
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "SNUG_CUDA_EMU_DEVICES=${devices}"
    "SNUG_NCCL=$<TARGET_FILE:snug_nccl_emu>")
  if(NOT t STREQUAL test_emu) # its kernels are its own, not the build's
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${SNUG_EMU_ENV})
  endif()
  set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED cuda_emu)
endforeach()
set_property(TEST test_emu PROPERTY LABELS "unit;cuda")
add_test(NAME cuda_emu_coverage_reset COMMAND ${CMAKE_COMMAND} -E rm -f ${SNUG_EMU_COVERAGE})
add_test(NAME cuda_emu_coverage COMMAND bash ${SNUG_EMU_DIR}/coverage.sh ${SNUG_EMU_DIR}/kernel_resources.tsv
  ${SNUG_EMU_COVERAGE})
set_tests_properties(cuda_emu_coverage_reset PROPERTIES FIXTURES_SETUP cuda_emu LABELS "unit;cuda")
# after the tests that launch kernels (when they run in the same ctest; alone, it reads what the last ones left)
set_tests_properties(cuda_emu_coverage PROPERTIES DEPENDS "${SNUG_EMU_TESTS}" LABELS "unit;cuda")
# the longest first, so with two at a time they do not finish last (about 260, 100 and 95 s on 2 cores)
set_tests_properties(cli_test_cuda_train PROPERTIES COST 1000)
set_tests_properties(test_cuda_ops PROPERTIES COST 900)
set_tests_properties(cli_test_cuda_train_nccl PROPERTIES COST 800)
