# car_add_subdirs(): add every immediate subfolder that has a CMakeLists.txt, so each module owns its own
# build file and adding a module needs no edit to its parent.
function(car_add_subdirs)
  file(GLOB children LIST_DIRECTORIES true ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(child ${children})
    if(IS_DIRECTORY ${child} AND EXISTS ${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()
