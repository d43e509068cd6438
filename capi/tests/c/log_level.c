/* log_level through the C API (tests/c_log_level.rs runs it): start one
 * engine per argument, each from that JSON configuration, in order, each
 * stopped when the next starts (or at the end). An argument "reload:<json>"
 * instead reloads the engine running with that configuration; a refused
 * reload is written to stderr as "reload refused: <message>". What the
 * library logs goes to stderr, for the test to read; the program prints
 * "ok" when every engine started. */
#include <stdio.h>
#include <string.h>

#include "tent.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <config json | reload:config json>...\n", argv[0]);
        return 2;
    }
    tent_engine_t *e = NULL;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "reload:", 7) == 0) {
            uint64_t generation = 0;
            if (e == NULL) {
                fprintf(stderr, "reload before any engine\n");
                return 2;
            }
            if (tent_engine_reload(e, argv[i] + 7, &generation) != TENT_OK) {
                fprintf(stderr, "reload refused: %s\n", tent_last_error_message());
            } else {
                fprintf(stderr, "reloaded: generation %llu\n", (unsigned long long)generation);
            }
            continue;
        }
        tent_engine_destroy(e);
        e = NULL;
        if (tent_engine_create(argv[i], &e) != TENT_OK) {
            fprintf(stderr, "tent_engine_create(%s): %s\n", argv[i], tent_last_error_message());
            return 1;
        }
    }
    tent_engine_destroy(e);
    printf("ok\n");
    return 0;
}
