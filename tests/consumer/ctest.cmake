# The installed-package test (included from tests/CMakeLists.txt): installs
# this build into a scratch prefix and builds tests/consumer against it with
# find_package and with pkg-config: the core alone, and (with MPI) the dist
# library too. It also checks that libmtopt.so needs no MPI or NCCL and, unless
# MTOPT_NATIVE is on, was compiled without -march=native.
set(_mtopt_consumer_flags "")
if(MTOPT_SANITIZE)
  set(_mtopt_consumer_flags "-fsanitize=address,undefined")
endif()
set(_mtopt_consumer_mpiexec "")
if(MTOPT_WITH_MPI)
  set(_mtopt_consumer_mpiexec "${MPIEXEC_EXECUTABLE}")
endif()
add_test(NAME consumer
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run.sh ${PROJECT_BINARY_DIR}
          ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_BINARY_DIR}/consumer-work
          "${_mtopt_consumer_flags}" "$<BOOL:${MTOPT_WITH_MPI}>"
          "$<BOOL:${MTOPT_NATIVE}>" "${_mtopt_consumer_mpiexec}")
set_tests_properties(consumer PROPERTIES LABELS cpu TIMEOUT 180)
