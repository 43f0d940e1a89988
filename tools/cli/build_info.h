// What the `vlm` binary was built from (generated at build time by build_info.cmake).
#pragma once

// `git describe --always --dirty` of the source tree at the last build ("" outside a git
// checkout): the commit, "-dirty" when tracked files differed from it.
const char* vlm_build_commit();
