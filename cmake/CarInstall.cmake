# Install rules and the Debian package (docs/operations.md, "Installing").
#   cmake --install build [--prefix DIR]   car (bin), car-inferenced (sbin), the systemd units, the sysusers
#                                          file, man pages, bash completion, docs and the example env file
#   cd build && cpack -G DEB               car-inference_<version>_<arch>.deb (prefix /usr)
include(GNUInstallDirs)

install(TARGETS car RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS car-inferenced RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR})

# The units name the binary (ExecStart=) and the docs (Documentation=) by absolute path, so they are written
# at install time from the prefix actually installed to: `cmake --install --prefix X` and CPack (which
# installs with prefix /usr) both get units that point at their own files.
set(CAR_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING "Where to install the systemd units (relative to the prefix)")
set(CAR_SYSUSERS_DIR "lib/sysusers.d" CACHE STRING "Where to install the sysusers.d file (relative to the prefix)")
set(car_units_tmp ${CMAKE_BINARY_DIR}/install-units)
install(CODE "
  set(CAR_SBINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SBINDIR}\")
  set(CAR_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
  foreach(unit car-inferenced.service car-inferenced.socket car-inferenced-http.socket)
    configure_file(\"${PROJECT_SOURCE_DIR}/systemd/\${unit}.in\" \"${car_units_tmp}/\${unit}\" @ONLY)
  endforeach()
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CAR_SYSTEMD_UNIT_DIR}\" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES \"${car_units_tmp}/car-inferenced.service\" \"${car_units_tmp}/car-inferenced.socket\"
             \"${car_units_tmp}/car-inferenced-http.socket\")
")
install(FILES ${PROJECT_SOURCE_DIR}/systemd/car-inference.sysusers DESTINATION ${CAR_SYSUSERS_DIR}
        RENAME car-inference.conf)

# Man pages (written in roff in the repo), installed gzipped as Debian policy asks (gzip -9n: no name or
# timestamp in the header, so the package is reproducible), and bash completion (reads `car --help` at
# completion time, so it follows the commands CLI11 knows).
find_program(CAR_GZIP gzip REQUIRED)
set(car_man_gz)
foreach(page car.1 car-inferenced.8)
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/man/${page}.gz
                     COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
                     COMMAND ${CAR_GZIP} -9nc ${PROJECT_SOURCE_DIR}/packaging/man/${page} > ${CMAKE_BINARY_DIR}/man/${page}.gz
                     DEPENDS ${PROJECT_SOURCE_DIR}/packaging/man/${page} VERBATIM)
  list(APPEND car_man_gz ${CMAKE_BINARY_DIR}/man/${page}.gz)
endforeach()
add_custom_target(car_man_pages ALL DEPENDS ${car_man_gz})
install(FILES ${CMAKE_BINARY_DIR}/man/car.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_BINARY_DIR}/man/car-inferenced.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/completion/car.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME car)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/completion/car.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME car-inferenced)

install(FILES ${PROJECT_SOURCE_DIR}/systemd/car-inference.env.example ${PROJECT_SOURCE_DIR}/README.md
              ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
# Debian's machine-readable copyright file (every package carries /usr/share/doc/PACKAGE/copyright).
install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(GLOB car_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${car_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})

# CPack: a Debian package. The maintainer scripts create the user from the sysusers file and enable nothing.
set(CPACK_PACKAGE_NAME car-inference)
set(CPACK_PACKAGE_VENDOR "car-inference")
# Who answers for the package: -DCAR_PACKAGE_MAINTAINER="Name <mail>" when building one to ship. Unset, it
# is the repository's own maintainers as its history names them (the author of the last commit).
set(CAR_PACKAGE_MAINTAINER "" CACHE STRING "The Debian package's Maintainer: field (empty: the last commit's author)")
set(car_maintainer "${CAR_PACKAGE_MAINTAINER}")
if(NOT car_maintainer)
  find_program(CAR_GIT git)
  if(CAR_GIT AND EXISTS ${PROJECT_SOURCE_DIR}/.git)
    execute_process(COMMAND ${CAR_GIT} log -1 "--format=%an <%ae>" WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                    OUTPUT_VARIABLE car_maintainer OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(NOT car_maintainer MATCHES "^[^<]+ <[^>]+@[^>]+>$")
    set(car_maintainer "The car-inference authors <car-inference@localhost>")
    message(STATUS "CAR_PACKAGE_MAINTAINER: no git history to take it from; set it for a package to ship")
  endif()
endif()
set(CPACK_PACKAGE_CONTACT "${car_maintainer}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${car_maintainer}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "GGUF model-serving daemon (car-inferenced) and its client (car)")
# CPack writes CPACK_PACKAGE_DESCRIPTION_SUMMARY as the synopsis and this text, each line indented by one
# space and an empty line as " .", as the extended description.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "car-inferenced keeps GGUF language models (dense and mixture-of-experts, the
usual quantized formats) loaded in a memory-budgeted cache and serves them to
local clients over a Unix socket in newline-delimited JSON, and optionally over
HTTP with the OpenAI API and a Prometheus /metrics endpoint. Concurrent
requests to one model are batched; experts of models larger than memory can
be streamed from disk.

car is its command-line client, and also runs, benchmarks and inspects GGUF
models without a daemon.

Installing creates the car-inference system user and group and enables
nothing: systemctl enable --now car-inferenced.socket starts the service.")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd | systemd-standalone-sysusers | opensysusers")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
    ${PROJECT_SOURCE_DIR}/packaging/debian/prerm ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/package)
include(CPack)
