# Tests of client/ (maskd_client, maskctl, the Python client) and load_tests/ (maskload), included by
# tests/CMakeLists.txt.

maskd_add_test(client_parse_test SOURCES client_parse_test.cc LIBS maskd_client)
maskd_add_test(client_fake_server_test SOURCES client_fake_server_test.cc
               LIBS maskctl_commands nlohmann_json::nlohmann_json)
# Issue #15: the returned embedding on the client (float32 widening, .npy, maskctl embed --out-embedding).
maskd_add_test(client_embedding_test SOURCES client_embedding_test.cc
               LIBS maskctl_commands maskd_server maskd_fake_engine)
maskd_add_test(maskload_stats_test SOURCES maskload_stats_test.cc LIBS maskd_load)
maskd_add_test(maskload_fake_server_test SOURCES maskload_fake_server_test.cc LIBS maskd_load)
# plot_maskload.py (MASKD_PYTHON with matplotlib, as the CLI test's plot needs): latency lines break
# at seconds with no completed call.
add_test(NAME maskload_plot_test
         COMMAND ${MASKD_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/maskload_plot_test.py
                 ${PROJECT_SOURCE_DIR}/load_tests/plot_maskload.py)
set_tests_properties(maskload_plot_test PROPERTIES LABELS cpu TIMEOUT 120)

# The Python client (client/python): pytest against a real maskd started by the test itself.
if(TARGET maskd)
  set(_maskd_bin_arg --maskd $<TARGET_FILE:maskd>)
else()
  set(_maskd_bin_arg)
endif()
# The TLS/token tests (test_client_security.py) run against maskd_fake (server_tests.cmake).
list(APPEND _maskd_bin_arg --maskd-fake $<TARGET_FILE:maskd_fake>)
add_test(NAME client_python_test
         COMMAND ${MASKD_PYTHON} -m pytest -v -p no:cacheprovider tests ${_maskd_bin_arg}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/client/python)
set_tests_properties(client_python_test PROPERTIES LABELS cpu TIMEOUT 900
                     ENVIRONMENT "MASKD_GOLDEN_DIR=${MASKD_GOLDEN_DIR}")

# maskload's CI run (issue 6): bounded runs against a CPU maskd with the tiny model; zero errors and
# JSON/CSV/PNG written. Exit 77 = skipped (no golden data outside CI).
if(TARGET maskd)
  add_test(NAME maskload_ci_test
           COMMAND ${PROJECT_SOURCE_DIR}/load_tests/ci_maskload.sh $<TARGET_FILE:maskd>
                   $<TARGET_FILE:maskload> $<TARGET_FILE:maskctl> ${PROJECT_BINARY_DIR}/maskload_ci)
  set_tests_properties(maskload_ci_test PROPERTIES LABELS cpu TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "MASKD_GOLDEN_DIR=${MASKD_GOLDEN_DIR};MASKD_PYTHON=${MASKD_PYTHON}")
endif()

# maskctl starts without LibTorch: no engine/LibTorch in its DT_NEEDED or loaded by an RPC command,
# and the model subcommands find libmaskctl_model.so (build tree, install layout, MASKCTL_MODEL_MODULE)
# or say clearly that they cannot.
add_test(NAME maskctl_lazy_model_test
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/maskctl_lazy_model_test.sh $<TARGET_FILE:maskctl>
                 $<TARGET_FILE:maskctl_model> $<TARGET_FILE:maskd_model> ${PROJECT_BINARY_DIR}/maskctl_lazy_model)
set_tests_properties(maskctl_lazy_model_test PROPERTIES LABELS cpu TIMEOUT 300)
