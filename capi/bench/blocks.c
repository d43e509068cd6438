/* Block lists from C: `tent_submit_blocks` of N scattered blocks, the
 * address lists as plain uint64_t arrays, into a second engine's shm
 * segment in this process. Prints the time inside the call (median and
 * worst of the repetitions) and the end-to-end rate beside one request of
 * the same bytes, as `tent-bench --mode blocks` does for Rust.
 *
 *   tools/bench-c-blocks.sh [blocks] [block_bytes] [reps]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tent.h"

static const char *CONFIG = "{\"workers\": {\"count\": 1}}";

#define OK(call)                                                                         \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != TENT_OK) {                                                            \
            fprintf(stderr, "%s:%d: %s = %d %s: %s\n", __FILE__, __LINE__, #call, rc_, \
                    tent_error_name(rc_), tent_last_error_message());                  \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One repetition: submit (blocks or one request) into a fresh batch, wait. */
static void round_trip(tent_engine_t *e, const tent_block_list_t *list,
                       const tent_request_t *one, uint64_t total, double *in_call,
                       double *end_to_end) {
    tent_batch_id_t batch;
    OK(tent_allocate_batch(e, 1, &batch));
    double t0 = now_s();
    if (list)
        OK(tent_submit_blocks(e, batch, list, NULL));
    else
        OK(tent_submit(e, batch, one, 1));
    double t1 = now_s();
    tent_status_t s;
    OK(tent_wait_batch(e, batch, 60000, &s));
    double t2 = now_s();
    if (s.state != TENT_STATUS_COMPLETED || s.transferred_bytes != total) {
        fprintf(stderr, "batch ended in state %d with %" PRIu64 " bytes\n", s.state,
                s.transferred_bytes);
        exit(1);
    }
    OK(tent_free_batch(e, batch));
    *in_call = t1 - t0;
    *end_to_end = t2 - t0;
}

static double report(const char *label, tent_engine_t *e, const tent_block_list_t *list,
                     const tent_request_t *one, uint64_t total, int reps) {
    double *call = calloc((size_t)reps, sizeof *call), *e2e = calloc((size_t)reps, sizeof *e2e);
    for (int r = 0; r < reps; r++) round_trip(e, list, one, total, &call[r], &e2e[r]);
    qsort(call, (size_t)reps, sizeof *call, by_value);
    qsort(e2e, (size_t)reps, sizeof *e2e, by_value);
    double gbps = (double)total / e2e[reps / 2] / 1e9;
    printf("%-26s submit call: median %7.3f ms, worst %7.3f ms   end to end %6.2f GB/s\n", label,
           call[reps / 2] * 1e3, call[reps - 1] * 1e3, gbps);
    free(call);
    free(e2e);
    return gbps;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000;
    uint64_t block = argc > 2 ? strtoull(argv[2], NULL, 10) : 16384;
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    if (n == 0 || block == 0 || reps < 1) {
        fprintf(stderr, "usage: blocks [blocks>0] [block_bytes>0] [reps>0]\n");
        return 2;
    }
    uint64_t total = n * block;
    tent_engine_t *e = NULL, *target = NULL;
    OK(tent_engine_create(CONFIG, &e));
    OK(tent_engine_create(CONFIG, &target));
    tent_buffer_t dst, src;
    OK(tent_allocate_memory(target, total, &dst));
    OK(tent_allocate_memory(e, total, &src));
    memset(src.addr, 0x5a, total);
    char name[256];
    OK(tent_local_segment_name(target, name, sizeof name));
    tent_segment_id_t seg;
    OK(tent_open_segment(e, name, &seg));

    /* The same scatter as tent-bench's: a fixed xorshift permutation. */
    uint64_t *local = malloc(n * sizeof *local), *remote = malloc(n * sizeof *remote);
    size_t *perm = malloc(n * sizeof *perm);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = n - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t j = (size_t)(x % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        local[i] = (uint64_t)(uintptr_t)src.addr + i * block;
        remote[i] = (uint64_t)(uintptr_t)dst.addr + perm[i] * block;
    }
    tent_block_list_t list = {.opcode = TENT_OPCODE_WRITE,
                              .target_id = seg,
                              .block_len = block,
                              .local_addrs = local,
                              .remote_addrs = remote,
                              .count = n,
                              .priority = TENT_PRIORITY_HIGH};
    tent_request_t one;
    memset(&one, 0, sizeof one);
    one.opcode = TENT_OPCODE_WRITE;
    one.source = src.addr;
    one.target_id = seg;
    one.target_offset = (uint64_t)(uintptr_t)dst.addr;
    one.length = total;
    double warm_call, warm_e2e;
    round_trip(e, NULL, &one, total, &warm_call, &warm_e2e);
    printf("# C blocks: %zu blocks of %" PRIu64 " B over shm (%.1f MiB), %d reps each\n", n, block,
           (double)total / (1 << 20), reps);
    double g_list = report("block list, scattered", e, &list, NULL, total, reps);
    double g_one = report("one request, same bytes", e, NULL, &one, total, reps);
    printf("# end to end vs one request: scattered %.2fx\n", g_list / g_one);
    free(local);
    free(remote);
    free(perm);
    tent_engine_destroy(e);
    tent_engine_destroy(target);
    return 0;
}
