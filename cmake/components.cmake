# Targets and front ends register themselves here (docs/architecture.md,
# "Adding a target or a front end"). A component's folder calls
#
#   softblk_add_target(NAME SOURCES src.cpp... [LIBRARIES lib...])
#   softblk_add_frontend(NAME SOURCES src.cpp... [LIBRARIES lib...])
#
# which builds the OBJECT library softblk_NAME from the sources (linking
# softblk_core and LIBRARIES publicly) and adds it to softblk_components.
# The folder's headers are its own: consumers include only the public
# headers (include/softblk/); a unit test of a component's internals adds
# the folder to its own include path. A target or front end registers its
# type from a static initialiser (register_target_type,
# register_export_type); an OBJECT library's objects are linked whole, so
# the linker never drops that initialiser as it would an unreferenced member
# of a static archive.
#
# softblk_components is an INTERFACE library that carries every registered
# component's usage requirements and, through $<TARGET_OBJECTS>, its object
# files to whatever links it (CMake passes the objects of an OBJECT library
# only to direct consumers; through $<TARGET_OBJECTS> in an interface they
# reach every consumer). Executables that need the device and export types
# (the `softblk` command, the drivers the tests use, tests of several
# components) link softblk_components, and so get every component, in
# whatever order the folders were added. A test of one component may link
# that component's library directly instead; never both (the objects would
# be linked twice).
#
# The folders themselves are listed once, in the top-level CMakeLists.txt:
# adding a component is its folder plus that one add_subdirectory line.

add_library(softblk_components INTERFACE)
set_property(GLOBAL PROPERTY SOFTBLK_TARGETS "")
set_property(GLOBAL PROPERTY SOFTBLK_FRONTENDS "")

function(_softblk_add_component kind name)
  cmake_parse_arguments(arg "" "" "SOURCES;LIBRARIES" ${ARGN})
  if(arg_UNPARSED_ARGUMENTS OR NOT arg_SOURCES)
    message(FATAL_ERROR "softblk_add_${kind}(${name} SOURCES file... [LIBRARIES lib...]): "
                        "no SOURCES, or unexpected arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  set(lib softblk_${name})
  add_library(${lib} OBJECT ${arg_SOURCES})
  target_link_libraries(${lib} PUBLIC softblk_core ${arg_LIBRARIES})
  set_target_properties(${lib} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  # Objects first: they need softblk_core and the libraries after them on
  # the link line.
  target_link_libraries(softblk_components INTERFACE $<TARGET_OBJECTS:${lib}> ${lib})
  set_property(GLOBAL APPEND PROPERTY SOFTBLK_${kind}S ${name})
endfunction()

# A target type (src/targets/NAME): softblk_NAME, registered with
# register_target_type.
function(softblk_add_target name)
  _softblk_add_component(TARGET ${name} ${ARGN})
endfunction()

# A front end (src/frontends/NAME): softblk_NAME, registered with
# register_export_type.
function(softblk_add_frontend name)
  _softblk_add_component(FRONTEND ${name} ${ARGN})
endfunction()

# Adds every folder below the current one that has a CMakeLists.txt, in
# name order: tests/, bench/ and fuzz/ use it, so that the tests, benchmarks
# and fuzzers of a new component are their folder only.
function(softblk_add_all_subdirectories)
  file(GLOB files CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*/CMakeLists.txt)
  list(SORT files)
  foreach(file IN LISTS files)
    get_filename_component(dir ${file} DIRECTORY)
    add_subdirectory(${dir})
  endforeach()
endfunction()
