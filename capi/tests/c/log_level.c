/* log_level through the C API (tests/c_log_level.rs runs it): start and
 * stop one engine per argument, each from that JSON configuration, in
 * order. What the library logs goes to stderr, for the test to read; the
 * program prints "ok" when every engine started. */
#include <stdio.h>

#include "tent.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <config json>...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        tent_engine_t *e = NULL;
        if (tent_engine_create(argv[i], &e) != TENT_OK) {
            fprintf(stderr, "tent_engine_create(%s): %s\n", argv[i], tent_last_error_message());
            return 1;
        }
        tent_engine_destroy(e);
    }
    printf("ok\n");
    return 0;
}
