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
