# car_version: an INTERFACE library giving <car_version.h> (CAR_VERSION, CAR_GIT_COMMIT) to the binaries'
# main.cpp files for --version. The header is regenerated on every build (cheap: one `git rev-parse`), so
# the commit is the one built, not the one configured; it is only rewritten when it changes.
set(CAR_VERSION_HEADER ${CMAKE_BINARY_DIR}/generated/car_version.h)
add_custom_target(car_version_header
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DOUT=${CAR_VERSION_HEADER} -DVERSION=${PROJECT_VERSION}
          -P ${PROJECT_SOURCE_DIR}/cmake/CarVersionWrite.cmake
  BYPRODUCTS ${CAR_VERSION_HEADER}
  COMMENT "car_version.h: version and git commit"
  VERBATIM)
add_library(car_version INTERFACE)
target_include_directories(car_version INTERFACE ${CMAKE_BINARY_DIR}/generated)
add_dependencies(car_version car_version_header)
