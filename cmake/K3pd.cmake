# Helpers shared by every CMakeLists.txt in the tree.

# k3pd_add_subdirs(): add every immediate subdirectory of the current source dir that has a
# CMakeLists.txt. Lets each area own its own directory without editing a shared list.
function(k3pd_add_subdirs)
  file(GLOB children LIST_DIRECTORIES true RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(child ${children})
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${child} AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()

# k3pd_add_check_test(NAME n SOURCES a.c b.c LIBS l1 l2 [LABELS x y] [TIMEOUT s])
# A Check test binary registered with CTest. Check runs each test in a forked child (CK_FORK).
function(k3pd_add_check_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} PkgConfig::CHECK Threads::Threads m)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABELS}"
                       ENVIRONMENT "K3PD_SOURCE_DIR=${PROJECT_SOURCE_DIR};K3PD_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()
