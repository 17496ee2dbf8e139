# ctest install.consumer: `cmake --install` into a temporary prefix, check the
# installed files, build and run a small consumer against the installed tree
# (find_package and pkg-config), and configure k3pack under add_subdirectory().
# Inputs: K3_SOURCE_DIR, K3_BUILD_DIR, K3_CXX, K3_GENERATOR, K3_*DIR (install dirs).
set(tmp ${K3_BUILD_DIR}/install-test)
set(prefix ${tmp}/prefix)
file(REMOVE_RECURSE ${tmp})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
endfunction()

run("cmake --install" ${CMAKE_COMMAND} --install ${K3_BUILD_DIR} --prefix ${prefix})
foreach(f ${K3_BINDIR}/k3pack ${K3_INCLUDEDIR}/k3pack/pack.h ${K3_INCLUDEDIR}/k3pack/progress.h
          ${K3_LIBDIR}/libk3_doctor.a ${K3_LIBDIR}/libk3_util.a ${K3_LIBDIR}/cmake/k3pack/k3packConfig.cmake
          ${K3_LIBDIR}/pkgconfig/k3pack.pc ${K3_MANDIR}/man1/k3pack.1 ${K3_DATADIR}/bash-completion/completions/k3pack)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

# What the library says must be what the installed binary says.
execute_process(COMMAND ${prefix}/${K3_BINDIR}/k3pack doctor /nonexistent.gguf RESULT_VARIABLE cli_rc
                OUTPUT_QUIET ERROR_QUIET)
set(expected "Q2_K 84 bytes/block, doctor exit ${cli_rc}")

run("consumer configure (find_package)" ${CMAKE_COMMAND} -S ${K3_SOURCE_DIR}/tests/install/consumer -B ${tmp}/consumer
    -G ${K3_GENERATOR} -DCMAKE_CXX_COMPILER=${K3_CXX} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run("consumer build (find_package)" ${CMAKE_COMMAND} --build ${tmp}/consumer)
run("consumer run (find_package)" ${tmp}/consumer/consumer)
string(STRIP "${last_out}" got)
if(NOT got STREQUAL expected)
  message(FATAL_ERROR "find_package consumer printed '${got}', expected '${expected}'")
endif()

set(ENV{PKG_CONFIG_PATH} ${prefix}/${K3_LIBDIR}/pkgconfig)
run("pkg-config" pkg-config --cflags --libs k3pack)
string(STRIP "${last_out}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run("consumer build (pkg-config)" ${K3_CXX} ${K3_SOURCE_DIR}/tests/install/consumer/main.cpp ${flags} -o ${tmp}/pc_consumer)
run("consumer run (pkg-config)" ${tmp}/pc_consumer)
string(STRIP "${last_out}" got)
if(NOT got STREQUAL expected)
  message(FATAL_ERROR "pkg-config consumer printed '${got}', expected '${expected}'")
endif()

run("add_subdirectory configure" ${CMAKE_COMMAND} -S ${K3_SOURCE_DIR}/tests/install/subdir -B ${tmp}/subdir
    -G ${K3_GENERATOR} -DCMAKE_CXX_COMPILER=${K3_CXX} -DK3_SOURCE_DIR=${K3_SOURCE_DIR})
file(REMOVE_RECURSE ${tmp})
message(STATUS "install.consumer: ${expected}")
