// Thread-local error state and the C-only helpers of include/crescent.h.
// (C definitions cannot live in the preamble of a file with //export.)
#include <stdlib.h>
#include <string.h>

#include "crescent.h"

static __thread char errbuf[1024];
static __thread int errcode;

const char *crescent_last_error(void) { return errbuf; }

int crescent_last_error_code(void) { return errcode; }

// Called from Go on the calling C thread; msg need not be NUL-terminated.
void crescent_set_error_(int code, const char *msg, size_t n) {
    if (n >= sizeof errbuf) n = sizeof errbuf - 1;
    if (n > 0) memcpy(errbuf, msg, n);
    errbuf[n] = 0;
    errcode = code;
}

void crescent_free(void *p) { free(p); }

void crescent_engine_free_notifs(crescent_notify_msg_t *msgs, size_t count) {
    if (msgs == NULL) return;
    for (size_t i = 0; i < count; i++) {
        free(msgs[i].name);
        free(msgs[i].msg);
    }
    free(msgs);
}
