# Tests of server/ (maskd_server), included by tests/CMakeLists.txt.
#
# Unit tests run the server against a fake engine: maskd_fake_engine (tests/fake_engine.h) implements
# the abstract Engine of model/api, so these binaries never see the real engine or torch. The
# end-to-end tests link the real engine.
add_library(maskd_fake_engine STATIC fake_engine.cc)
target_include_directories(maskd_fake_engine PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(maskd_fake_engine PUBLIC maskd_io)

maskd_add_test(server_cache_test SOURCES server_cache_test.cc LIBS maskd_server maskd_fake_engine)
maskd_add_test(server_batcher_test SOURCES server_batcher_test.cc LIBS maskd_server maskd_fake_engine)
maskd_add_test(server_config_test SOURCES server_config_test.cc LIBS maskd_server maskd_fake_engine)
maskd_add_test(server_validation_test SOURCES server_validation_test.cc
               LIBS maskd_server maskd_fake_engine)
maskd_add_test(server_service_test SOURCES server_service_test.cc
               LIBS maskd_server maskd_client maskd_fake_engine)
# Issue #14: SegmentStream's session on a transport of plain threads, for ThreadSanitizer (gRPC and
# abseil from Debian are not instrumented); CI runs it in the TSan tree too.
maskd_add_test(server_stream_session_test SOURCES server_stream_session_test.cc
               LIBS maskd_server maskd_fake_engine)
# Issue #15: the HTTP front through real HTTP (cpp-httplib's client) on fake engines.
maskd_add_test(server_http_front_test SOURCES server_http_front_test.cc
               LIBS maskd_server maskd_client maskd_fake_engine PkgConfig::HTTPLIB)

# Issue #15: Embed's return_embedding (fp32/bf16/fp16 bytes) over gRPC and the HTTP front.
maskd_add_test(server_embedding_test SOURCES server_embedding_test.cc
               LIBS maskd_server maskd_client maskd_fake_engine PkgConfig::HTTPLIB nlohmann_json::nlohmann_json)

# End to end with the real engine and the golden tiny model (skips loudly without the golden data,
# fails under CI=true). Runs the maskd binary too, so it depends on it.
maskd_add_test(server_e2e_test SOURCES server_e2e_test.cc
               LIBS maskd_server maskd_model maskd_client nlohmann_json::nlohmann_json)
add_dependencies(server_e2e_test maskd)

# Issue #15: GenerateMasks end to end with the real engine on the golden tiny model (the generator's
# parity model): the RPC against the engine-side generator (and the original's records when
# model_generate_test's oracle file is there), formats, by-id, validation, fairness with clicks,
# expiry mid-generation, POST /v1/generate.
maskd_add_test(server_generate_test SOURCES server_generate_test.cc
               LIBS maskd_server maskd_model maskd_client maskd_generate nlohmann_json::nlohmann_json
                    PkgConfig::HTTPLIB)

# Issue #14 hardening: server-facing findings through real gRPC (fake engines).
# maskd around the fake engine, for tests that signal a real process mid-load or mid-batch.
add_executable(maskd_fake fake_maskd_main.cc)
target_link_libraries(maskd_fake PRIVATE maskd_server maskd_fake_engine)
maskd_add_test(hardening_server_test SOURCES hardening_server_test.cc
               LIBS maskd_server maskd_client maskd_fake_engine)
add_dependencies(hardening_server_test maskd maskd_fake)
# Issue #14: the bad-input corpus (one table, >= 150 cases across every RPC; a good request after each).
maskd_add_test(hardening_corpus_test SOURCES hardening_corpus_test.cc
               LIBS maskd_server maskd_client maskd_fake_engine)
maskd_add_test(hardening_config_test SOURCES hardening_config_test.cc
               LIBS maskd_server maskd_fake_engine)
# Issue #14 hardening with the real engine (the built-in demo model; needs no golden data).
maskd_add_test(hardening_e2e_test SOURCES hardening_e2e_test.cc
               LIBS maskd_server maskd_model maskd_client)
# Issue #14: malicious pickles (os.system, posix.system, builtins.exec, subprocess.Popen, INST,
# BUILD/__setstate__, nested) crafted at test time, each proven live under Python's pickle, then
# refused by `maskd --checkpoint` with nothing run.
add_test(NAME hardening_pickle_test
         COMMAND ${MASKD_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/hardening_pickle_test.py
                 --maskd $<TARGET_FILE:maskd>)
set_tests_properties(hardening_pickle_test PROPERTIES LABELS cpu TIMEOUT 300)
# Issue #14 security: TLS, mutual TLS, bearer tokens, health exemption, reflection, maskctl's flags;
# certificates made at test time by make_test_certs.sh (openssl CLI).
maskd_add_test(server_security_test SOURCES server_security_test.cc
               LIBS maskd_server maskctl_commands maskd_fake_engine PkgConfig::HTTPLIB)

# Soak: mixed traffic against an in-process server (fake engines) for MASKD_SOAK_SECONDS (default
# 20 s in the suite; CI's soak step runs it longer): answered exactly once, no losses, flat RSS.
maskd_add_test(soak_test SOURCES soak_test.cc LIBS maskd_server maskd_fake_engine LABELS cpu soak)

# Issue #14: out of device memory splits a batch in halves and retries; what fails alone gets
# RESOURCE_EXHAUSTED (fake engine with injected out-of-memory errors, through real gRPC).
maskd_add_test(server_oom_test SOURCES server_oom_test.cc LIBS maskd_server maskd_client maskd_fake_engine)
# ... and the same with the real engine on CUDA under a memory cap picked after warm-up (random vit_b
# weights; gpu: skips without a device).
maskd_add_test(server_oom_gpu_test SOURCES server_oom_gpu_test.cc
               LIBS maskd_server maskd_model maskd_client LABELS gpu)
# ... the batchers' split alone (no gRPC), small enough for the TSan step of .ci/run.
maskd_add_test(server_oom_batcher_test SOURCES server_oom_batcher_test.cc LIBS maskd_server maskd_fake_engine)
