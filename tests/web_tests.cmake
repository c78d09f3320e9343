# Issue #15 (polygons, COCO export, HTTP front, web page): Python tests in tests/web/ against a real
# maskd on the built-in demo model (CPU; no data needed), included by tests/CMakeLists.txt.
# MASKD_PYTHON needs pycocotools, pytest, numpy, Pillow (scripts/setup.sh's venv).
if(TARGET maskd AND TARGET maskctl)
  add_test(NAME web_coco_export_test
           COMMAND ${MASKD_PYTHON} -m pytest -v -p no:cacheprovider coco_export_test.py
                   --maskd $<TARGET_FILE:maskd> --maskctl $<TARGET_FILE:maskctl>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/web)
  set_tests_properties(web_coco_export_test PROPERTIES LABELS cpu TIMEOUT 600)
endif()
if(TARGET maskd AND TARGET maskctl)
  add_test(NAME web_http_front_test
           COMMAND ${MASKD_PYTHON} -m pytest -v -p no:cacheprovider -W ignore::DeprecationWarning
                   http_front_test.py --maskd $<TARGET_FILE:maskd> --maskctl $<TARGET_FILE:maskctl>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/web)
  set_tests_properties(web_http_front_test PROPERTIES LABELS cpu TIMEOUT 600)
endif()
# GenerateMasks from the outside: maskctl everything (a folder, progress, --out-coco loaded by
# pycocotools, polygons) and POST /v1/generate.
if(TARGET maskd AND TARGET maskctl)
  add_test(NAME web_generate_test
           COMMAND ${MASKD_PYTHON} -m pytest -v -p no:cacheprovider -W ignore::DeprecationWarning
                   generate_test.py --maskd $<TARGET_FILE:maskd> --maskctl $<TARGET_FILE:maskctl>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/web)
  set_tests_properties(web_generate_test PROPERTIES LABELS cpu TIMEOUT 600)
endif()
# The page in headless Chromium (Debian's chromium + chromium-driver, Selenium from PyPI): screenshots
# and the click -> overlay timings stay in BUILD/web_artefacts. Labelled cpu like the rest, so CI
# (scripts/setup.sh test: the whole suite) runs it; `ctest -L browser` picks it alone.
if(TARGET maskd)
  add_test(NAME web_page_browser_test
           COMMAND ${MASKD_PYTHON} -m pytest -v -s -p no:cacheprovider -W ignore::DeprecationWarning
                   web_page_test.py --maskd $<TARGET_FILE:maskd> --artefacts ${PROJECT_BINARY_DIR}/web_artefacts
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/web)
  set_tests_properties(web_page_browser_test PROPERTIES LABELS "cpu;browser" TIMEOUT 600)
endif()
