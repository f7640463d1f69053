# MPI's part of mtopt_dist.pc (included from the top-level CMakeLists.txt once
# MPI is found). mtopt_dist.h includes <mpi.h> and its calls take an MPI_Comm,
# so MPI is a public requirement: its Cflags and Libs both go to the user.
#
# Where the MPI that CMake found has its own pkg-config module (Open MPI:
# ompi-c; MPICH: mpich; Debian's alternatives: mpi-c), name it in Requires, so
# the user's pkg-config resolves MPI on the user's machine. Only a module whose
# library directory holds the libmpi CMake found is taken: Debian's mpi-c can
# point at another MPI than the one the library was built with. Otherwise the
# flags CMake found are written out as they are.
# Sets MTOPT_PC_MPI_REQUIRES, MTOPT_PC_MPI_CFLAGS and MTOPT_PC_MPI_LIBS.
set(MTOPT_PC_MPI_REQUIRES "")
set(MTOPT_PC_MPI_CFLAGS "")
set(MTOPT_PC_MPI_LIBS "")

set(_mtopt_mpi_dirs "")
foreach(_lib IN LISTS MPI_C_LIBRARIES)
  if(_lib MATCHES "(^|/)lib(mpi|mpich)[.]")
    get_filename_component(_dir "${_lib}" DIRECTORY)
    get_filename_component(_dir "${_dir}" REALPATH)
    list(APPEND _mtopt_mpi_dirs "${_dir}")
  endif()
endforeach()

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND AND _mtopt_mpi_dirs)
  foreach(_mod ompi-c mpich mpi-c mpi)
    execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --libs-only-L ${_mod}
      RESULT_VARIABLE _rc OUTPUT_VARIABLE _ldirs ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _rc EQUAL 0)
      continue()
    endif()
    separate_arguments(_ldirs UNIX_COMMAND "${_ldirs}")
    foreach(_l IN LISTS _ldirs)
      string(REGEX REPLACE "^-L" "" _l "${_l}")
      get_filename_component(_l "${_l}" REALPATH)
      if(_l IN_LIST _mtopt_mpi_dirs)
        set(MTOPT_PC_MPI_REQUIRES "${_mod}")
        break()
      endif()
    endforeach()
    if(MTOPT_PC_MPI_REQUIRES)
      break()
    endif()
  endforeach()
endif()

if(NOT MTOPT_PC_MPI_REQUIRES)
  foreach(_dir IN LISTS MPI_C_INCLUDE_DIRS)
    string(APPEND MTOPT_PC_MPI_CFLAGS " -I${_dir}")
  endforeach()
  foreach(_def IN LISTS MPI_C_COMPILE_DEFINITIONS)
    string(APPEND MTOPT_PC_MPI_CFLAGS " -D${_def}")
  endforeach()
  foreach(_opt IN LISTS MPI_C_COMPILE_OPTIONS)
    string(APPEND MTOPT_PC_MPI_CFLAGS " ${_opt}")
  endforeach()
  foreach(_lib IN LISTS MPI_C_LIBRARIES)
    string(APPEND MTOPT_PC_MPI_LIBS " ${_lib}")
  endforeach()
  foreach(_flag IN LISTS MPI_C_LINK_FLAGS)
    string(APPEND MTOPT_PC_MPI_LIBS " ${_flag}")
  endforeach()
  string(STRIP "${MTOPT_PC_MPI_CFLAGS}" MTOPT_PC_MPI_CFLAGS)
  string(STRIP "${MTOPT_PC_MPI_LIBS}" MTOPT_PC_MPI_LIBS)
endif()
message(STATUS "mtopt_dist.pc: MPI from "
  "${MTOPT_PC_MPI_REQUIRES}${MTOPT_PC_MPI_LIBS}")
unset(_mtopt_mpi_dirs)
