# Differential tests against the original Python SAM (segment_anything, in MASKD_PYTHON), included by
# tests/CMakeLists.txt: beyond the fixed golden files, each seed builds a SAM with a random encoder
# configuration (width, depth, heads, window, global blocks) and random weights, random images and
# prompts, and the C++ engine must match the original within the golden README's fp32 tolerances.
# One test per seed, so a failure names its seed; exit 77 = skipped (no segment_anything outside CI).
# The default seeds cover every choice of make_golden.py's encoder between them: embed_dim 64/96/32,
# heads 2/4/1, window 14/7/8 (padded 64 -> 70, padded, unpadded), depth 4/2/4, global blocks [0]/[1]/[0, 2].
set(MASKD_ORACLE_SEEDS 1 17 30 CACHE STRING "Seeds of the differential tests against the original SAM")

if(TARGET maskctl)
  foreach(seed IN LISTS MASKD_ORACLE_SEEDS)
    add_test(NAME oracle_seed_${seed}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/oracle/run_oracle_test.sh ${MASKD_PYTHON}
                     $<TARGET_FILE:maskctl> ${seed} ${PROJECT_BINARY_DIR}/oracle)
    set_tests_properties(oracle_seed_${seed} PROPERTIES LABELS cpu TIMEOUT 600 SKIP_RETURN_CODE 77)
  endforeach()
endif()
