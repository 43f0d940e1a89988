// Invariant checks for programming errors (never for user input: that returns Status).
#pragma once

#include <cstdio>
#include <cstdlib>

#define VLM_CHECK(cond, msg)                                                               \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "vlm: internal invariant failed at %s:%d: %s (%s)\n", __FILE__, \
                   __LINE__, #cond, msg);                                                  \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
