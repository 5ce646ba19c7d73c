// Walking a directory tree of a FAT volume (what `ls -R`, `cp -r` and
// `rm -r` do), safely on damaged images.
//
// A damaged or hostile image can hold a directory entry that leads back to
// an ancestor (a cycle: followed, it never ends) or to a directory already
// walked elsewhere (cross-linked: followed, it repeats, and a chain of such
// links doubles the work at every level). The walk enters each directory
// (by its first cluster) once: it refuses a subdirectory that is one of its
// own ancestors, the root included, or that it has already walked, and
// reports it through walk_visitor::skipped with the path; it never follows
// `.` or `..` (readdir does not return them). It runs in a loop, not by
// recursion, and holds only the current path's pending subdirectories, so
// neither the stack nor memory grow with what the image claims beyond
// limits it states (walk_limits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <softblk/fat/volume.hpp>

namespace softblk::fat {

struct walk_limits {
    // Longest path (bytes) of a directory that is entered: Linux's PATH_MAX,
    // the longest path through which a mounted volume can be reached. A
    // deeper directory is skipped (ENAMETOOLONG); this also bounds the
    // depth, at 2048 levels.
    size_t max_path_bytes = 4096;
    // Bytes held for the subdirectories still to walk of the directories on
    // the current path (their names and about 40 bytes each). Beyond it the
    // walk goes no deeper there (skipped, E2BIG). Real trees hold a few KiB.
    size_t max_pending_bytes = 64u << 20;
};

class walk_visitor {
public:
    virtual ~walk_visitor() = default;

    // A directory reached, with its entries (readdir's order, no `.` or
    // `..`), before any of its subdirectories is walked. `path` is the
    // start as given, or below it joined with '/'. An error stops the walk
    // and is what walk() returns.
    virtual result<void> enter(const std::string& path, const std::vector<dir_entry>& entries) = 0;
    // After the directory's subdirectories were walked or skipped. An error
    // stops the walk.
    virtual result<void> leave(const std::string& path) { return {}; }
    // A subdirectory that is not walked: a cycle (ELOOP), a directory
    // already walked (EMLINK), beyond walk_limits (ENAMETOOLONG, E2BIG), or
    // one that cannot be read (its error). `why.message` starts with the
    // path. The walk goes on with the next entry.
    virtual void skipped(const std::string& path, const error& why) = 0;
};

struct walk_summary {
    uint64_t directories = 0;  // entered, the start included
    uint64_t skipped = 0;      // subdirectories reported to skipped()
};

// Walks the tree below the directory `start` depth first, in readdir's
// order: enter(start), then for each subdirectory its whole walk, then
// leave(start). The visitor may change the volume between calls (rm -r
// removes what enter() listed); the entries it was given stay the plan.
// Returns the counts, or the error of reading `start` (ENOTDIR when it is
// a file) or of a visitor call that stopped the walk. Caller's thread; the
// volume must outlive the call.
result<walk_summary> walk(volume& vol, std::string_view start, walk_visitor& visitor,
                          const walk_limits& limits = {});

}  // namespace softblk::fat
