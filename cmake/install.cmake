# `cmake --install`: the programs, their man pages and the bash completion,
# where Debian puts them (GNUInstallDirs; docs/install.md says what goes
# where). The C library, its headers, pkg-config file and CMake package
# configuration have their own rules beside the library (COMPONENT lib and
# dev); everything here is COMPONENT programs.
include(GNUInstallDirs)
find_package(Python3 3.9 REQUIRED COMPONENTS Interpreter)

# softblk and softblk-driver go to sbin: what they are for, block devices
# for the kernel (a loop device over the FUSE file, ublk, NBD), needs root,
# as losetup and nbd-client, whose pages are in section 8 too. A user can
# still run /usr/sbin/softblk: its daemon then keeps its run directory in
# $XDG_RUNTIME_DIR and exports files and sockets only. softblk-fat works
# on image files as any user: bin.
install(TARGETS softblk softblk-driver RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR}
  COMPONENT programs)
install(TARGETS softblk-fat RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT programs)

# The man pages and the completion come from the built programs (their
# --help and `softblk features --json`), so they say what the programs do
# (scripts/man/generate.py; tests/package checks them).
set(_softblk_man_dir ${PROJECT_BINARY_DIR}/man)
set(_softblk_man_pages ${_softblk_man_dir}/softblk.8 ${_softblk_man_dir}/softblk-fat.8
  ${_softblk_man_dir}/softblk-driver.8)
set(_softblk_config_page ${_softblk_man_dir}/softblk-devices.d.5)
set(_softblk_completion ${_softblk_man_dir}/softblk.bash-completion)
file(GLOB _softblk_man_scripts CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/scripts/man/*.py)
add_custom_command(OUTPUT ${_softblk_man_pages} ${_softblk_config_page} ${_softblk_completion}
  COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/scripts/man/generate.py
    --softblk $<TARGET_FILE:softblk> --fat $<TARGET_FILE:softblk-fat>
    --driver $<TARGET_FILE:softblk-driver> --version ${PROJECT_VERSION} --out ${_softblk_man_dir}
  DEPENDS softblk softblk-fat softblk-driver ${_softblk_man_scripts}
  COMMENT "Man pages and bash completion from the programs' --help and features"
  VERBATIM)
add_custom_target(softblk_man ALL DEPENDS ${_softblk_man_pages} ${_softblk_config_page}
  ${_softblk_completion})
install(FILES ${_softblk_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT programs)
install(FILES ${_softblk_config_page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man5 COMPONENT programs)
install(FILES ${_softblk_completion} DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
  RENAME softblk COMPONENT programs)

# softblk.service (systemd/softblk.service.in, docs/install.md) in systemd's
# directory for system units: what pkg-config's systemd says
# (/lib/systemd/system on Debian 12), else that; below the install prefix
# when the prefix is not /usr (a staging install must not write to /lib).
set(SOFTBLK_SYSTEMD_UNIT_DIR "" CACHE STRING
  "where softblk.service is installed (default: pkg-config systemd's systemdsystemunitdir)")
if(SOFTBLK_SYSTEMD_UNIT_DIR)
  set(_softblk_unit_dir ${SOFTBLK_SYSTEMD_UNIT_DIR})
else()
  pkg_get_variable(_softblk_unit_dir systemd systemdsystemunitdir)
  if(NOT _softblk_unit_dir)
    set(_softblk_unit_dir /lib/systemd/system)
  endif()
  if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(_softblk_unit_dir ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
  endif()
endif()
set(SOFTBLK_SBINDIR ${CMAKE_INSTALL_FULL_SBINDIR})
configure_file(${PROJECT_SOURCE_DIR}/systemd/softblk.service.in
  ${PROJECT_BINARY_DIR}/systemd/softblk.service @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/systemd/softblk.service DESTINATION ${_softblk_unit_dir}
  COMPONENT programs)

# The devices `softblk apply` makes (softblk-devices.d(5)): the directory
# empty (/etc/softblk/devices.d when the prefix is /usr, GNUInstallDirs'
# rule), an example file among the documentation.
install(DIRECTORY DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/softblk/devices.d COMPONENT programs)
install(FILES ${PROJECT_SOURCE_DIR}/examples/devices.d/data.conf
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/devices.d COMPONENT programs)
