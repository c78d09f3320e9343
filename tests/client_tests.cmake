# Tests of client/ (maskd_client, maskctl, the Python client) and load_tests/ (maskload), included by
# tests/CMakeLists.txt.

maskd_add_test(client_parse_test SOURCES client_parse_test.cc LIBS maskd_client)
maskd_add_test(client_fake_server_test SOURCES client_fake_server_test.cc
               LIBS maskctl_commands nlohmann_json::nlohmann_json)
maskd_add_test(maskload_stats_test SOURCES maskload_stats_test.cc LIBS maskd_load)
maskd_add_test(maskload_fake_server_test SOURCES maskload_fake_server_test.cc LIBS maskd_load)
