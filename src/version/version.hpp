// What `--version` prints after the program's name (CMakeLists.txt here).
#pragma once

namespace softblk {

// "0.1.0 (commit v0.1.0-3-g1234abc-dirty)": the project's VERSION and the
// commit of the source tree at build time ("unknown" when neither git nor
// SOFTBLK_COMMIT could tell).
const char* version_string();

}  // namespace softblk
