# The sources of the FAT library (softblk_fat), listed once for its three
# builds: src/fs/fat/CMakeLists.txt, fuzz/fat/CMakeLists.txt and
# fuzz/fat/run_fuzz.sh, which runs `cmake -P sources.cmake` to print them.
set(SOFTBLK_FAT_LIBRARY_SOURCES
  block_device.cpp
  chains.cpp
  directory.cpp
  fat_table.cpp
  file_io.cpp
  format.cpp
  mount.cpp
  names.cpp
  path_ops.cpp
  sector_cache.cpp
  volume_state.cpp
  walk.cpp)
if(CMAKE_SCRIPT_MODE_FILE)
  foreach(_source IN LISTS SOFTBLK_FAT_LIBRARY_SOURCES)
    message(NOTICE "${_source}")
  endforeach()
endif()
