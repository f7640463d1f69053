# The installed-package test (included from tests/CMakeLists.txt): installs
# this build into a scratch prefix and builds tests/consumer against it with
# find_package and with pkg-config.
set(_mtopt_consumer_flags "")
if(MTOPT_SANITIZE)
  set(_mtopt_consumer_flags "-fsanitize=address,undefined")
endif()
add_test(NAME consumer
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run.sh ${PROJECT_BINARY_DIR}
          ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_BINARY_DIR}/consumer-work
          "${_mtopt_consumer_flags}")
set_tests_properties(consumer PROPERTIES LABELS cpu TIMEOUT 120)
