/* Two processes move data through tent's C API (tests/c_two_process.rs
 * runs both).
 *
 *   two_process target
 *     Exports a region filled with pattern(1), prints
 *     "SEGMENT <name> <addr> <len>", then answers lines on stdin until EOF:
 *     "CHECK <off> <len> <seed>" with "CHECK OK" or "CHECK BAD";
 *     "NOTE <off> <len> <seed>" by waiting for a notification, then
 *     checking the range at once: "NOTE <from> <name> <hex msg> CHECK OK".
 *   two_process initiator <name> <addr> <len>
 *     Opens the target's segment, reads pattern(1) back (batch), writes
 *     pattern(2) into the first half (batch) and pattern(3) into the second
 *     (ring), reads everything back (batch and ring) and verifies it; then
 *     writes pattern(4) into the first quarter with a notification attached
 *     ("kv-ready", "quarter"), sends one alone ("done", bytes 00 01 02 ff),
 *     and reads the region back as block lists. Every status is checked;
 *     prints "INITIATOR <its segment name>" and "INITIATOR OK".
 *
 * Byte i of the region under pattern(seed) is (uint8_t)(i * 31 + seed), i
 * counted from the region's start, so any slice can be checked alone. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent.h"

static const char *CONFIG =
    "{\"workers\": {\"count\": 1, \"pin\": false, \"spin_us\": 20, \"yield_us\": 50,"
    " \"park_timeout_ms\": 20}, \"default_timeout_ms\": 10000}";

#define WAIT_MS 20000

/* Fail the process with the call, its code and the thread's message. */
#define OK(call)                                                                         \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != TENT_OK) {                                                            \
            fprintf(stderr, "%s:%d: %s = %d %s: %s\n", __FILE__, __LINE__, #call, rc_, \
                    tent_error_name(rc_), tent_last_error_message());                  \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static uint8_t pattern_at(uint64_t i, uint8_t seed) { return (uint8_t)(i * 31 + seed); }

static void fill(uint8_t *p, uint64_t first, uint64_t len, uint8_t seed) {
    for (uint64_t i = 0; i < len; i++) p[i] = pattern_at(first + i, seed);
}

/* Does p hold pattern(seed) for region bytes [first, first + len)? */
static int holds(const uint8_t *p, uint64_t first, uint64_t len, uint8_t seed) {
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != pattern_at(first + i, seed)) {
            fprintf(stderr, "byte %" PRIu64 " is %u, want %u (seed %u)\n", first + i, p[i],
                    pattern_at(first + i, seed), seed);
            return 0;
        }
    return 1;
}

static int target(void) {
    const uint64_t len = 4u << 20;
    tent_engine_t *engine = NULL;
    OK(tent_engine_create(CONFIG, &engine));
    tent_buffer_t region;
    OK(tent_allocate_memory(engine, len, &region));
    CHECK(region.length == len && region.addr != NULL);
    fill(region.addr, 0, len, 1);
    char name[256];
    OK(tent_segment_name(engine, name, sizeof name));
    printf("SEGMENT %s %" PRIu64 " %" PRIu64 "\n", name, (uint64_t)(uintptr_t)region.addr, len);
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        uint64_t off, n;
        unsigned seed;
        char cmd[8];
        if (sscanf(line, "%7s %" SCNu64 " %" SCNu64 " %u", cmd, &off, &n, &seed) != 4) break;
        if (strcmp(cmd, "NOTE") == 0) {
            /* The data must be there when the notification is. */
            static tent_notification_t note;
            OK(tent_wait_notification(engine, WAIT_MS, &note));
            printf("NOTE %s %s ", note.from, note.name);
            for (size_t i = 0; i < note.msg_len; i++) printf("%02x", note.msg[i]);
            printf(" ");
        } else if (strcmp(cmd, "CHECK") != 0) {
            break;
        }
        int good = off + n <= len && holds((uint8_t *)region.addr + off, off, n, (uint8_t)seed);
        printf("%s\n", good ? "CHECK OK" : "CHECK BAD");
        fflush(stdout);
    }
    OK(tent_unregister_memory(engine, region.region_id));
    tent_engine_destroy(engine);
    return 0;
}

/* Submit `n` requests as one batch, wait, check each task and the whole. */
static void run_batch(tent_engine_t *engine, const tent_request_t *reqs, size_t n) {
    tent_batch_id_t batch;
    OK(tent_allocate_batch(engine, n, &batch));
    OK(tent_submit(engine, batch, reqs, n));
    tent_status_t overall;
    OK(tent_wait_batch(engine, batch, WAIT_MS, &overall));
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += reqs[i].length;
    CHECK(overall.state == TENT_STATUS_COMPLETED && overall.error == TENT_OK);
    CHECK(overall.transferred_bytes == total);
    tent_status_t list[8];
    size_t count = 0;
    CHECK(n <= 8);
    OK(tent_task_status_list(engine, batch, list, 8, &count));
    CHECK(count == n);
    for (size_t i = 0; i < n; i++) {
        tent_status_t one;
        OK(tent_task_status(engine, batch, i, &one));
        CHECK(one.state == list[i].state && one.error == list[i].error &&
              one.transferred_bytes == list[i].transferred_bytes &&
              one.transport == list[i].transport);
        CHECK(one.state == TENT_STATUS_COMPLETED && one.transferred_bytes == reqs[i].length);
        /* Another process on this host: shared memory carried it. */
        CHECK(one.transport == TENT_TRANSPORT_SHM);
    }
    OK(tent_free_batch(engine, batch));
}

/* Push through the ring, submit, and reap one completion per request. */
static void run_ring(tent_ring_t *ring, tent_engine_t *engine, const tent_request_t *reqs,
                     size_t n) {
    size_t pushed = 0, submitted = 99;
    OK(tent_ring_push(ring, engine, reqs, n, &pushed));
    CHECK(pushed == n);
    OK(tent_ring_submit(ring, &submitted));
    CHECK(submitted == 0); /* the push published them already */
    size_t reaped = 0;
    while (reaped < n) {
        OK(tent_ring_wait(ring, WAIT_MS));
        tent_cqe_t cqes[4];
        size_t got = 0;
        OK(tent_ring_reap(ring, cqes, 4, &got));
        for (size_t i = 0; i < got; i++) {
            const tent_request_t *r = NULL;
            for (size_t k = 0; k < n; k++)
                if (reqs[k].user_data == cqes[i].user_data) r = &reqs[k];
            CHECK(r != NULL);
            CHECK(cqes[i].result == (int64_t)r->length);
            CHECK(cqes[i].transport == TENT_TRANSPORT_SHM);
            CHECK(cqes[i].fallback == 0 && cqes[i].failover_exhausted == 0);
        }
        reaped += got;
    }
    CHECK(reaped == n);
}

static int initiator(const char *name, uint64_t base, uint64_t len) {
    const uint64_t half = len / 2;
    tent_engine_t *engine = NULL;
    OK(tent_engine_create(CONFIG, &engine));

    tent_segment_id_t seg, again;
    OK(tent_open_segment(engine, name, &seg));
    OK(tent_open_segment(engine, name, &again));
    CHECK(seg == again && seg != TENT_LOCAL_SEGMENT_ID);
    int alive = 0;
    OK(tent_probe_peer_alive(engine, seg, 5000, &alive));
    CHECK(alive == 1);
    tent_region_info_t regions[16];
    size_t nregions = 0;
    OK(tent_segment_info(engine, seg, regions, 16, &nregions));
    int found = 0;
    for (size_t i = 0; i < nregions; i++)
        found |= regions[i].addr == base && regions[i].length == len;
    CHECK(found);

    /* Local memory: one buffer tent allocates, one the program owns. */
    tent_buffer_t local;
    OK(tent_allocate_memory(engine, len, &local));
    uint8_t *own = malloc(len);
    CHECK(own != NULL);
    memset(own, 0, len);
    tent_buffer_t own_reg;
    OK(tent_register_memory(engine, own, len, &own_reg));
    CHECK(own_reg.addr == own && own_reg.length == len);
    uint8_t *lp = local.addr;

    /* READ the target's pattern(1), in four requests of mixed priority. */
    tent_request_t reqs[4];
    memset(reqs, 0, sizeof reqs); /* zeroed: READ, HIGH, any transport */
    const uint64_t quarter = len / 4;
    for (int i = 0; i < 4; i++) {
        reqs[i].source = own + i * quarter;
        reqs[i].target_id = seg;
        reqs[i].target_offset = base + i * quarter;
        reqs[i].length = quarter;
        reqs[i].priority = i % 3;
    }
    CHECK(reqs[0].opcode == TENT_OPCODE_READ);
    run_batch(engine, reqs, 4);
    CHECK(holds(own, 0, len, 1));

    /* WRITE pattern(2) into the first half with the batch API. */
    fill(lp, 0, half, 2);
    tent_request_t w = {.opcode = TENT_OPCODE_WRITE,
                        .source = lp,
                        .target_id = seg,
                        .target_offset = base,
                        .length = half,
                        .priority = TENT_PRIORITY_MEDIUM};
    run_batch(engine, &w, 1);

    /* WRITE pattern(3) into the second half through the ring, in two. */
    fill(lp + half, half, half, 3);
    tent_ring_t *ring = NULL;
    OK(tent_ring_create(engine, 0, &ring));
    tent_request_t rw[2] = {
        {.opcode = TENT_OPCODE_WRITE,
         .source = lp + half,
         .target_id = seg,
         .target_offset = base + half,
         .length = half / 2,
         .user_data = 7},
        {.opcode = TENT_OPCODE_WRITE,
         .source = lp + half + half / 2,
         .target_id = seg,
         .target_offset = base + half + half / 2,
         .length = half / 2,
         .priority = TENT_PRIORITY_LOW,
         .user_data = 8},
    };
    run_ring(ring, engine, rw, 2);

    /* READ it all back: the first half with the batch API into the
     * program's memory, the second through the ring into tent's. */
    memset(own, 0, len);
    memset(lp, 0, len);
    tent_request_t rb = {.source = own, .target_id = seg, .target_offset = base, .length = half};
    run_batch(engine, &rb, 1);
    tent_request_t rr = {.source = lp + half,
                         .target_id = seg,
                         .target_offset = base + half,
                         .length = half,
                         .user_data = 9};
    run_ring(ring, engine, &rr, 1);
    CHECK(holds(own, 0, half, 2));
    CHECK(holds(lp + half, half, half, 3));

    /* WRITE pattern(4) into the first quarter, the notification after it. */
    fill(lp, 0, quarter, 4);
    tent_request_t nw = {.opcode = TENT_OPCODE_WRITE,
                         .source = lp,
                         .target_id = seg,
                         .target_offset = base,
                         .length = quarter};
    tent_batch_id_t batch;
    OK(tent_allocate_batch(engine, 1, &batch));
    OK(tent_submit_with_notification(engine, batch, &nw, 1, "kv-ready", "quarter", 7));
    tent_status_t s;
    OK(tent_wait_batch(engine, batch, WAIT_MS, &s));
    CHECK(s.state == TENT_STATUS_COMPLETED && s.transferred_bytes == quarter);
    OK(tent_free_batch(engine, batch));
    const uint8_t bytes[4] = {0, 1, 2, 255};
    OK(tent_send_notification(engine, seg, "done", bytes, sizeof bytes));

    /* READ it all back as block lists into the program's memory: the
     * first half in order (contiguous: one run), the second in blocks
     * taken in reverse order (none merge: eight runs); one task each. */
    enum { BLOCKS = 8 };
    const uint64_t block = half / BLOCKS;
    uint64_t local_addrs[BLOCKS], remote_addrs[BLOCKS];
    memset(own, 0, len);
    OK(tent_allocate_batch(engine, 1 + BLOCKS, &batch));
    for (int i = 0; i < BLOCKS; i++) {
        local_addrs[i] = (uint64_t)(uintptr_t)own + i * block;
        remote_addrs[i] = base + i * block;
    }
    tent_block_list_t first = {.opcode = TENT_OPCODE_READ,
                               .target_id = seg,
                               .block_len = block,
                               .local_addrs = local_addrs,
                               .remote_addrs = remote_addrs,
                               .count = BLOCKS};
    size_t tasks = 0;
    OK(tent_submit_blocks(engine, batch, &first, &tasks));
    CHECK(tasks == 1);
    for (int i = 0; i < BLOCKS; i++) {
        local_addrs[i] = (uint64_t)(uintptr_t)own + half + (BLOCKS - 1 - i) * block;
        remote_addrs[i] = base + half + (BLOCKS - 1 - i) * block;
    }
    tent_block_list_t second = first;
    second.priority = TENT_PRIORITY_LOW;
    OK(tent_submit_blocks(engine, batch, &second, &tasks));
    CHECK(tasks == 1);
    OK(tent_wait_batch(engine, batch, WAIT_MS, &s));
    CHECK(s.state == TENT_STATUS_COMPLETED && s.transferred_bytes == len);
    size_t count = 0;
    /* An empty array is too small: it says how many tasks there are. */
    CHECK(tent_task_status_list(engine, batch, NULL, 0, &count) == TENT_ERR_INVALID_ARGUMENT);
    CHECK(count == 2);
    OK(tent_free_batch(engine, batch));
    CHECK(holds(own, 0, quarter, 4));
    CHECK(holds(own + quarter, quarter, half - quarter, 2));
    CHECK(holds(own + half, half, half, 3));

    char me[TENT_SEGMENT_NAME_SIZE];
    OK(tent_segment_name(engine, me, sizeof me));
    printf("INITIATOR %s\n", me);

    tent_ring_destroy(ring);
    OK(tent_unregister_memory(engine, own_reg.region_id));
    free(own);
    OK(tent_unregister_memory(engine, local.region_id));
    OK(tent_close_segment(engine, seg));
    tent_engine_destroy(engine);
    printf("INITIATOR OK\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "target") == 0) return target();
    if (argc == 5 && strcmp(argv[1], "initiator") == 0)
        return initiator(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    fprintf(stderr, "usage: %s target | initiator <segment> <addr> <len>\n", argv[0]);
    return 2;
}
