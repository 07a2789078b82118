// test.h: a minimal test harness. Every CHECK is one counted test: it prints "ok - <name>" or
// "FAIL - <name>: <detail>". test/run_tests.sh counts those lines over all test programs and
// closes with "N passed, M failed". A test program returns test_summary() from main().
#ifndef TEST_H
#define TEST_H

#include <stdio.h>   // printf
#include <stdlib.h>  // exit status

static int test_n_pass, test_n_fail;

// CHECK(cond, name, detail-format, ...): name is a short string; detail explains a failure.
#define CHECK(cond, name, ...)                                                  \
    do {                                                                        \
        if (cond) {                                                             \
            test_n_pass++;                                                      \
            printf("ok - %s\n", name);                                          \
        } else {                                                                \
            test_n_fail++;                                                      \
            printf("FAIL - %s (%s:%d): ", name, __FILE__, __LINE__);            \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
        }                                                                       \
        fflush(stdout);                                                         \
    } while (0)

static inline int test_summary(const char *program) {
    printf("# %s: %d passed, %d failed\n", program, test_n_pass, test_n_fail);
    return test_n_fail ? 1 : 0;
}

// max that propagates NaN (fmax drops it): a NaN on either side then fails a "< bound" check.
static inline double nan_max(double a, double b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }

#endif  // TEST_H
