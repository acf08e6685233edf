// EXPECT(cond) for the engine's C++ unit tests: prints the failed condition with its file and
// line and exits with status 1 (the test runners in tests/ read the exit status).
#ifndef MXREC_TESTS_CC_EXPECT_H_
#define MXREC_TESTS_CC_EXPECT_H_

#include <cstdio>
#include <cstdlib>

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

#endif  // MXREC_TESTS_CC_EXPECT_H_
