/* A minimal assertion helper for the C tests. */
#ifndef CRESCENT_CHECK_H
#define CRESCENT_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#include "crescent.h"

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error %d: %s)\n", __FILE__,    \
                    __LINE__, #cond, crescent_last_error_code(), crescent_last_error());   \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define CHECK_RC(call, want)                                                               \
    do {                                                                                   \
        long long rc_ = (long long)(call);                                                 \
        if (rc_ != (long long)(want)) {                                                    \
            fprintf(stderr, "%s:%d: %s = %lld, want %lld (%s)\n", __FILE__, __LINE__,      \
                    #call, rc_, (long long)(want), crescent_last_error());                 \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define CHECK_OK(call) CHECK_RC(call, 0)

#endif
