/* Bad input at the boundary (tests/c_bad_input.rs runs it, linked
 * statically): NULL pointers, zero lengths, buffers too small, unknown
 * segments, freed batches, indexes out of range, a ring whose engine is
 * gone, notifications over their limits, malformed block lists. Each call must return its typed code with a message saying what
 * was wrong, lose nothing, and leave the process running: the program
 * goes on to prove the engine still works, and prints
 * "N passed, 0 failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

#include "tent.h"

static const char *CONFIG =
    "{\"workers\": {\"count\": 1, \"pin\": false, \"spin_us\": 20, \"yield_us\": 50,"
    " \"park_timeout_ms\": 20}, \"default_timeout_ms\": 10000}";

static int passed, failed;

/* `call` returns `want`, and on failure the thread's message contains `text`. */
#define EXPECT(call, want, text) expect_at(__LINE__, #call, (call), (want), (text))

static void expect_at(int line, const char *what, int rc, int want, const char *text) {
    const char *msg = tent_last_error_message();
    if (rc != want) {
        fprintf(stderr, "line %d: %s = %d %s (%s), want %d %s\n", line, what, rc,
                tent_error_name(rc), msg, want, tent_error_name(want));
        failed++;
    } else if (want != TENT_OK && (msg == NULL || strstr(msg, text) == NULL)) {
        fprintf(stderr, "line %d: %s: message \"%s\" lacks \"%s\"\n", line, what,
                msg ? msg : "(null)", text);
        failed++;
    } else {
        passed++;
    }
}

#define CHECK(cond) check_at(__LINE__, #cond, (cond))

static void check_at(int line, const char *what, int ok) {
    if (ok) {
        passed++;
    } else {
        fprintf(stderr, "line %d: check failed: %s\n", line, what);
        failed++;
    }
}

/* Wait for a single-task batch and return its task's status. */
static tent_status_t settle(tent_engine_t *e, tent_batch_id_t b) {
    tent_status_t s;
    memset(&s, 0, sizeof s);
    EXPECT(tent_wait_batch(e, b, 10000, NULL), TENT_OK, "");
    EXPECT(tent_task_status(e, b, 0, &s), TENT_OK, "");
    return s;
}

static void engines(void) {
    tent_engine_t *e = (tent_engine_t *)0x1;
    EXPECT(tent_engine_create("{not json", &e), TENT_ERR_INVALID_ARGUMENT, "configuration");
    CHECK(e == (tent_engine_t *)0x1); /* out-pointer untouched on failure */
    EXPECT(tent_engine_create("{\"workers\": {\"count\": 0}}", &e), TENT_ERR_INVALID_ARGUMENT,
           "tent_engine_create");
    EXPECT(tent_engine_create(CONFIG, NULL), TENT_ERR_INVALID_ARGUMENT, "out_engine");
    EXPECT(tent_engine_create_from_file(NULL, &e), TENT_ERR_INVALID_ARGUMENT, "path is NULL");
    EXPECT(tent_engine_create_from_file("/nonexistent/tent.json", &e),
           TENT_ERR_INVALID_ARGUMENT, "configuration");
    tent_engine_destroy(NULL); /* a no-op */

    /* From a file, and (config NULL) from TENT_CONF. */
    char path[] = "/tmp/tent-capi-config-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, CONFIG, strlen(CONFIG)) == (ssize_t)strlen(CONFIG));
    close(fd);
    e = NULL;
    EXPECT(tent_engine_create_from_file(path, &e), TENT_OK, "");
    CHECK(e != NULL);
    tent_engine_destroy(e);
    unlink(path);
    setenv("TENT_CONF", "{\"workers\": {\"count\": 0}}", 1);
    EXPECT(tent_engine_create(NULL, &e), TENT_ERR_INVALID_ARGUMENT, "TENT_CONF");
    setenv("TENT_CONF", CONFIG, 1);
    e = NULL;
    EXPECT(tent_engine_create(NULL, &e), TENT_OK, "");
    CHECK(e != NULL);
    tent_engine_destroy(e);
    unsetenv("TENT_CONF");

    char name[64] = "untouched";
    EXPECT(tent_segment_name(NULL, name, sizeof name), TENT_ERR_INVALID_ARGUMENT,
           "engine is NULL");
    EXPECT(tent_open_segment(NULL, "x", NULL), TENT_ERR_INVALID_ARGUMENT, "engine is NULL");
    EXPECT(tent_submit(NULL, 1, NULL, 0), TENT_ERR_INVALID_ARGUMENT, "engine is NULL");
    EXPECT(tent_ring_create(NULL, 0, NULL), TENT_ERR_INVALID_ARGUMENT, "engine is NULL");
    CHECK(strcmp(name, "untouched") == 0);
}

/* The engine's own names, copied into buffers of every size. */
static void names(tent_engine_t *e) {
    char name[128];
    EXPECT(tent_segment_name(e, name, sizeof name), TENT_OK, "");
    size_t need = strlen(name) + 1;
    CHECK(need > 1 && strchr(name, ':') != NULL); /* ip:port */
    char small[128];
    memset(small, 'x', sizeof small);
    EXPECT(tent_segment_name(e, small, need - 1), TENT_ERR_INVALID_ARGUMENT, "too small");
    CHECK(small[0] == 'x'); /* left as it was */
    EXPECT(tent_segment_name(e, small, need), TENT_OK, "");
    CHECK(strcmp(small, name) == 0);
    EXPECT(tent_segment_name(e, NULL, 64), TENT_ERR_INVALID_ARGUMENT, "buffer is NULL");
    EXPECT(tent_local_segment_name(e, name, sizeof name), TENT_OK, "");
    CHECK(strlen(name) > 0); /* shm is on by default */
    EXPECT(tent_local_segment_name(e, name, 1), TENT_ERR_INVALID_ARGUMENT, "too small");
}

static void segments(tent_engine_t *e) {
    tent_segment_id_t seg = 77;
    EXPECT(tent_open_segment(e, NULL, &seg), TENT_ERR_INVALID_ARGUMENT, "name is NULL");
    EXPECT(tent_open_segment(e, "local", NULL), TENT_ERR_INVALID_ARGUMENT, "out_segment");
    EXPECT(tent_open_segment(e, "tent-capi-no-such-segment", &seg), TENT_ERR_SEGMENT_NOT_FOUND,
           "");
    EXPECT(tent_open_segment(e, "\xff\xfe", &seg), TENT_ERR_INVALID_ARGUMENT, "UTF-8");
    CHECK(seg == 77);
    EXPECT(tent_open_segment(e, "local", &seg), TENT_OK, "");
    CHECK(seg == TENT_LOCAL_SEGMENT_ID);
    EXPECT(tent_close_segment(e, 4242), TENT_ERR_SEGMENT_NOT_FOUND, "not open");
    EXPECT(tent_close_segment(e, TENT_LOCAL_SEGMENT_ID), TENT_ERR_INVALID_ARGUMENT,
           "cannot be closed");
    size_t count = 99;
    EXPECT(tent_segment_info(e, 4242, NULL, 0, &count), TENT_ERR_SEGMENT_NOT_FOUND, "not open");
    EXPECT(tent_segment_info(e, 0, NULL, 0, NULL), TENT_ERR_INVALID_ARGUMENT, "count");
    int alive = 5;
    EXPECT(tent_probe_peer_alive(e, 4242, 100, &alive), TENT_ERR_SEGMENT_NOT_FOUND, "not open");
    EXPECT(tent_probe_peer_alive(e, 0, 100, NULL), TENT_ERR_INVALID_ARGUMENT, "alive");
    EXPECT(tent_probe_peer_alive(e, TENT_LOCAL_SEGMENT_ID, 100, &alive), TENT_OK, "");
    CHECK(alive == 1);
}

static void memory(tent_engine_t *e, tent_buffer_t *a, tent_buffer_t *b) {
    tent_buffer_t buf;
    EXPECT(tent_allocate_memory(e, 0, &buf), TENT_ERR_INVALID_ARGUMENT, "zero length");
    EXPECT(tent_allocate_memory(e, 4096, NULL), TENT_ERR_INVALID_ARGUMENT, "out_buffer");
    EXPECT(tent_register_memory(e, NULL, 4096, &buf), TENT_ERR_INVALID_ARGUMENT, "null");
    EXPECT(tent_unregister_memory(e, 999999), TENT_ERR_ADDRESS_NOT_REGISTERED,
           "not registered");
    EXPECT(tent_allocate_memory(e, 65536, a), TENT_OK, "");
    EXPECT(tent_allocate_memory(e, 65536, b), TENT_OK, "");

    /* The local segment lists both; an array too small says how many. */
    size_t count = 0;
    tent_region_info_t regions[8];
    memset(regions, 0xab, sizeof regions);
    EXPECT(tent_segment_info(e, 0, regions, 1, &count), TENT_ERR_INVALID_ARGUMENT, "too small");
    CHECK(count == 2);
    CHECK(regions[0].length == 0xabababababababab); /* nothing written */
    EXPECT(tent_segment_info(e, 0, regions, 8, &count), TENT_OK, "");
    CHECK(count == 2 && regions[0].length == 65536 && regions[1].length == 65536);
    CHECK((regions[0].addr == (uint64_t)(uintptr_t)a->addr &&
           regions[1].addr == (uint64_t)(uintptr_t)b->addr) ||
          (regions[1].addr == (uint64_t)(uintptr_t)a->addr &&
           regions[0].addr == (uint64_t)(uintptr_t)b->addr));
}

/* A request moving `len` bytes from a + off to b (the local segment). */
static tent_request_t local_write(const tent_buffer_t *a, const tent_buffer_t *b, uint64_t off,
                                  uint64_t len) {
    tent_request_t r;
    memset(&r, 0, sizeof r);
    r.opcode = TENT_OPCODE_WRITE;
    r.source = (char *)a->addr + off;
    r.target_id = TENT_LOCAL_SEGMENT_ID;
    r.target_offset = (uint64_t)(uintptr_t)b->addr + off;
    r.length = len;
    return r;
}

static void requests(tent_engine_t *e, const tent_buffer_t *a, const tent_buffer_t *b) {
    tent_batch_id_t batch;
    EXPECT(tent_allocate_batch(e, 0, &batch), TENT_ERR_INVALID_ARGUMENT, "capacity 0");
    EXPECT(tent_allocate_batch(e, 4, NULL), TENT_ERR_INVALID_ARGUMENT, "out_batch");
    EXPECT(tent_allocate_batch(e, 2, &batch), TENT_OK, "");

    /* Refused at submit, with nothing queued: the batch stays empty. */
    tent_request_t r = local_write(a, b, 0, 0);
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "request 0");
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "zero length");
    tent_request_t zeroed;
    memset(&zeroed, 0, sizeof zeroed);
    EXPECT(tent_submit(e, batch, &zeroed, 1), TENT_ERR_INVALID_ARGUMENT, "zero length");
    char stack[64];
    r = local_write(a, b, 0, 64);
    r.source = stack;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_ADDRESS_NOT_REGISTERED, "request 0");
    r = local_write(a, b, 65536 - 8, 64);
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_OUT_OF_BOUNDS, "request 0");
    r = local_write(a, b, 0, 64);
    r.opcode = 7;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "opcode 7");
    r = local_write(a, b, 0, 64);
    r.priority = 3;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "priority 3");
    r = local_write(a, b, 0, 64);
    r.transport_hint = -1;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "transport_hint -1");
    r = local_write(a, b, 0, 64);
    r.flags = 0x80;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "flags 0x80");
    EXPECT(tent_submit(e, batch, NULL, 1), TENT_ERR_INVALID_ARGUMENT, "requests is NULL");
    EXPECT(tent_submit(e, batch, NULL, 0), TENT_ERR_INVALID_ARGUMENT, "empty");
    tent_request_t three[3] = {local_write(a, b, 0, 64), local_write(a, b, 64, 64),
                               local_write(a, b, 128, 64)};
    EXPECT(tent_submit(e, batch, three, 3), TENT_ERR_INVALID_ARGUMENT, "overflow");
    /* The second request is bad: the first is not queued either. */
    tent_request_t good_bad[2] = {local_write(a, b, 0, 64), local_write(a, b, 0, 64)};
    good_bad[1].source = stack;
    EXPECT(tent_submit(e, batch, good_bad, 2), TENT_ERR_ADDRESS_NOT_REGISTERED, "request 1");
    size_t count = 99;
    EXPECT(tent_task_status_list(e, batch, NULL, 0, &count), TENT_OK, "");
    CHECK(count == 0);
    tent_status_t s;
    EXPECT(tent_overall_status(e, batch, &s), TENT_OK, "");
    CHECK(s.state == TENT_STATUS_INITIAL);

    /* Accepted, then refused by the engine: an unknown segment. */
    r = local_write(a, b, 0, 64);
    r.target_id = 4242;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_OK, "");
    s = settle(e, batch);
    CHECK(s.state == TENT_STATUS_INVALID && s.error == TENT_ERR_SEGMENT_NOT_FOUND);
    CHECK(s.transferred_bytes == 0);

    /* A good one after it, in the same batch: task 1. */
    memset(a->addr, 0x5a, 64);
    r = local_write(a, b, 0, 64);
    EXPECT(tent_submit(e, batch, &r, 1), TENT_OK, "");
    EXPECT(tent_wait_batch(e, batch, 10000, &s), TENT_OK, "");
    CHECK(s.state == TENT_STATUS_INVALID); /* overall: the worst task */
    CHECK(s.transferred_bytes == 64);
    EXPECT(tent_task_status(e, batch, 1, &s), TENT_OK, "");
    CHECK(s.state == TENT_STATUS_COMPLETED && s.transferred_bytes == 64 && s.error == 0);
    CHECK(s.transport == TENT_TRANSPORT_LOCAL);
    CHECK(memcmp(a->addr, b->addr, 64) == 0);

    /* Indexes out of range, a status list too small. */
    EXPECT(tent_task_status(e, batch, 2, &s), TENT_ERR_INVALID_ARGUMENT, "out of range");
    EXPECT(tent_task_status(e, batch, 0, NULL), TENT_ERR_INVALID_ARGUMENT, "out_status");
    EXPECT(tent_cancel_task(e, batch, 9), TENT_ERR_INVALID_ARGUMENT, "out of range");
    tent_status_t list[2];
    memset(list, 0x11, sizeof list);
    EXPECT(tent_task_status_list(e, batch, list, 1, &count), TENT_ERR_INVALID_ARGUMENT,
           "too small");
    CHECK(count == 2 && list[0].state == 0x11111111);
    EXPECT(tent_task_status_list(e, batch, list, 2, NULL), TENT_ERR_INVALID_ARGUMENT, "count");
    EXPECT(tent_task_status_list(e, batch, NULL, 2, &count), TENT_ERR_INVALID_ARGUMENT,
           "array is NULL");
    EXPECT(tent_task_status_list(e, batch, list, 2, &count), TENT_OK, "");
    CHECK(count == 2 && list[0].state == TENT_STATUS_INVALID &&
          list[1].state == TENT_STATUS_COMPLETED);
    EXPECT(tent_cancel(e, batch), TENT_OK, ""); /* all done: nothing changes */
    EXPECT(tent_task_status(e, batch, 1, &s), TENT_OK, "");
    CHECK(s.state == TENT_STATUS_COMPLETED);

    /* A freed batch: every call on it is refused, and says so. */
    EXPECT(tent_free_batch(e, batch), TENT_OK, "");
    EXPECT(tent_free_batch(e, batch), TENT_ERR_INVALID_ARGUMENT, "double free");
    r = local_write(a, b, 0, 64);
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_INVALID_ARGUMENT, "freed");
    EXPECT(tent_task_status(e, batch, 0, &s), TENT_ERR_INVALID_ARGUMENT, "not allocated");
    EXPECT(tent_overall_status(e, batch, &s), TENT_ERR_INVALID_ARGUMENT, "not allocated");
    EXPECT(tent_task_status_list(e, batch, list, 2, &count), TENT_ERR_INVALID_ARGUMENT,
           "not allocated");
    EXPECT(tent_wait_batch(e, batch, 10, &s), TENT_ERR_INVALID_ARGUMENT, "not allocated");
    EXPECT(tent_cancel(e, batch), TENT_ERR_INVALID_ARGUMENT, "not allocated");
    EXPECT(tent_cancel_task(e, batch, 0), TENT_ERR_INVALID_ARGUMENT, "not allocated");

    /* Cancel: a task canceled before the worker takes it may still
     * complete (it is small); either way it ends, and the batch frees. */
    EXPECT(tent_allocate_batch(e, 1, &batch), TENT_OK, "");
    r = local_write(a, b, 0, 65536);
    r.priority = TENT_PRIORITY_LOW;
    EXPECT(tent_submit(e, batch, &r, 1), TENT_OK, "");
    EXPECT(tent_cancel_task(e, batch, 0), TENT_OK, "");
    s = settle(e, batch);
    CHECK(s.state == TENT_STATUS_CANCELED || s.state == TENT_STATUS_COMPLETED);
    CHECK(s.state != TENT_STATUS_CANCELED || s.error == TENT_ERR_CANCELED);
    EXPECT(tent_free_batch(e, batch), TENT_OK, "");
}

static void rings(tent_engine_t *e, const tent_buffer_t *a, const tent_buffer_t *b) {
    tent_ring_t *ring = NULL;
    EXPECT(tent_ring_create(e, 3, &ring), TENT_ERR_INVALID_ARGUMENT, "ring depth");
    EXPECT(tent_ring_create(e, 0, NULL), TENT_ERR_INVALID_ARGUMENT, "out_ring");
    EXPECT(tent_ring_create(e, 2, &ring), TENT_OK, "");
    tent_ring_destroy(NULL); /* a no-op */

    tent_request_t reqs[3] = {local_write(a, b, 0, 64), local_write(a, b, 64, 64),
                              local_write(a, b, 128, 64)};
    for (int i = 0; i < 3; i++) reqs[i].user_data = 100 + i;
    size_t pushed = 99;
    EXPECT(tent_ring_push(NULL, e, reqs, 1, &pushed), TENT_ERR_INVALID_ARGUMENT,
           "ring is NULL");
    EXPECT(tent_ring_push(ring, NULL, reqs, 1, &pushed), TENT_ERR_INVALID_ARGUMENT,
           "engine is NULL");
    EXPECT(tent_ring_push(ring, e, NULL, 1, &pushed), TENT_ERR_INVALID_ARGUMENT,
           "requests is NULL");
    EXPECT(tent_ring_push(ring, e, reqs, 0, &pushed), TENT_ERR_INVALID_ARGUMENT, "empty");
    tent_request_t bad = reqs[0];
    bad.length = 0;
    EXPECT(tent_ring_push(ring, e, &bad, 1, &pushed), TENT_ERR_INVALID_ARGUMENT, "zero length");
    CHECK(pushed == 0);

    /* A ring of 2 takes 2 of 3; the third waits, nothing is lost. */
    EXPECT(tent_ring_push(ring, e, reqs, 3, &pushed), TENT_ERR_SQ_FULL, "ring full");
    CHECK(pushed == 2);
    tent_cqe_t cqes[4];
    size_t got = 0, total = 0;
    uint64_t seen = 0;
    EXPECT(tent_ring_reap(ring, cqes, 4, NULL), TENT_ERR_INVALID_ARGUMENT, "count");
    EXPECT(tent_ring_reap(ring, NULL, 4, &got), TENT_ERR_INVALID_ARGUMENT, "cqes");
    EXPECT(tent_ring_reap(NULL, cqes, 4, &got), TENT_ERR_INVALID_ARGUMENT, "ring is NULL");
    while (total < 2) {
        EXPECT(tent_ring_wait(ring, 10000), TENT_OK, "");
        EXPECT(tent_ring_reap(ring, cqes, 4, &got), TENT_OK, "");
        for (size_t i = 0; i < got; i++) {
            CHECK(cqes[i].result == 64);
            seen |= 1u << (cqes[i].user_data - 100);
        }
        total += got;
    }
    EXPECT(tent_ring_push(ring, e, &reqs[2], 1, &pushed), TENT_OK, "");
    CHECK(pushed == 1);
    EXPECT(tent_ring_wait(ring, 10000), TENT_OK, "");
    EXPECT(tent_ring_reap(ring, cqes, 4, &got), TENT_OK, "");
    CHECK(got == 1 && cqes[0].result == 64);
    seen |= 1u << (cqes[0].user_data - 100);
    CHECK(seen == 7);

    /* Inline issue off and on, and the completion fd. */
    EXPECT(tent_ring_set_inline(NULL, 1), TENT_ERR_INVALID_ARGUMENT, "ring is NULL");
    EXPECT(tent_ring_completion_fd(ring, NULL), TENT_ERR_INVALID_ARGUMENT, "fd");
    EXPECT(tent_ring_prepare_wait(ring, NULL), TENT_ERR_INVALID_ARGUMENT, "sleep");
    EXPECT(tent_ring_finish_wait(NULL), TENT_ERR_INVALID_ARGUMENT, "ring is NULL");
    int efd = -1, sleep_ok = -1;
    EXPECT(tent_ring_completion_fd(ring, &efd), TENT_OK, "");
    CHECK(efd >= 0);
    EXPECT(tent_ring_set_inline(ring, 0), TENT_OK, "");
    EXPECT(tent_ring_prepare_wait(ring, &sleep_ok), TENT_OK, "");
    CHECK(sleep_ok == 1);
    EXPECT(tent_ring_push(ring, e, &reqs[0], 1, NULL), TENT_OK, "");
    struct pollfd pfd = {efd, POLLIN, 0};
    CHECK(poll(&pfd, 1, 10000) == 1);
    EXPECT(tent_ring_finish_wait(ring), TENT_OK, "");
    EXPECT(tent_ring_wait(ring, 10000), TENT_OK, "");
    EXPECT(tent_ring_reap(ring, cqes, 4, &got), TENT_OK, "");
    CHECK(got == 1 && cqes[0].result == 64);
    /* Issued inline: the completion is there when push returns. */
    EXPECT(tent_ring_set_inline(ring, 1), TENT_OK, "");
    EXPECT(tent_ring_push(ring, e, &reqs[0], 1, NULL), TENT_OK, "");
    EXPECT(tent_ring_reap(ring, cqes, 4, &got), TENT_OK, "");
    CHECK(got == 1 && cqes[0].result == 64);

    /* A request the engine refuses completes with its code. */
    bad = reqs[0];
    bad.target_id = 4242;
    bad.user_data = 55;
    EXPECT(tent_ring_push(ring, e, &bad, 1, NULL), TENT_OK, "");
    EXPECT(tent_ring_submit(ring, NULL), TENT_OK, "");
    EXPECT(tent_ring_wait(ring, 10000), TENT_OK, "");
    EXPECT(tent_ring_reap(ring, cqes, 4, &got), TENT_OK, "");
    CHECK(got == 1 && cqes[0].user_data == 55 && cqes[0].result == TENT_ERR_SEGMENT_NOT_FOUND);

    /* Nothing in flight: a wait times out; a reap finds nothing. */
    EXPECT(tent_ring_wait(ring, 1), TENT_ERR_TIMEOUT, "no completion");
    EXPECT(tent_ring_reap(ring, cqes, 4, &got), TENT_OK, "");
    CHECK(got == 0);
    EXPECT(tent_ring_reap(ring, NULL, 0, &got), TENT_OK, "");
    EXPECT(tent_ring_submit(NULL, NULL), TENT_ERR_INVALID_ARGUMENT, "ring is NULL");
    EXPECT(tent_ring_wait(NULL, 1), TENT_ERR_INVALID_ARGUMENT, "ring is NULL");
    tent_ring_destroy(ring);
}

/* Notifications, within this process: to this engine (segment 0), and
 * between two engines. */
static void notifications(tent_engine_t *e, const tent_buffer_t *a, const tent_buffer_t *b) {
    static tent_notification_t n;
    char me[TENT_SEGMENT_NAME_SIZE];
    EXPECT(tent_segment_name(e, me, sizeof me), TENT_OK, "");
    EXPECT(tent_send_notification(NULL, 0, "x", "m", 1), TENT_ERR_INVALID_ARGUMENT,
           "engine is NULL");
    EXPECT(tent_send_notification(e, 0, NULL, "m", 1), TENT_ERR_INVALID_ARGUMENT,
           "name is NULL");
    EXPECT(tent_send_notification(e, 0, "x", NULL, 3), TENT_ERR_INVALID_ARGUMENT,
           "msg is NULL");
    char long_name[TENT_MAX_NOTIFY_NAME + 2];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    EXPECT(tent_send_notification(e, 0, long_name, NULL, 0), TENT_ERR_INVALID_ARGUMENT,
           "exceeds");
    static char big[TENT_MAX_NOTIFY_MSG + 1];
    EXPECT(tent_send_notification(e, 0, "x", big, sizeof big), TENT_ERR_INVALID_ARGUMENT,
           "exceeds");
    EXPECT(tent_send_notification(e, 4242, "x", NULL, 0), TENT_ERR_SEGMENT_NOT_FOUND,
           "not open");
    EXPECT(tent_recv_notification(e, &n), TENT_ERR_TIMEOUT, "no notification");
    EXPECT(tent_wait_notification(e, 10, &n), TENT_ERR_TIMEOUT, "no notification");

    /* At the limits; a call that cannot hand one over takes none. */
    long_name[TENT_MAX_NOTIFY_NAME] = 0;
    EXPECT(tent_send_notification(e, 0, long_name, big, TENT_MAX_NOTIFY_MSG), TENT_OK, "");
    const uint8_t two[2] = {0, 9};
    EXPECT(tent_send_notification(e, TENT_LOCAL_SEGMENT_ID, "two", two, 2), TENT_OK, "");
    EXPECT(tent_recv_notification(e, NULL), TENT_ERR_INVALID_ARGUMENT, "out_notification");
    EXPECT(tent_wait_notification(e, 1000, NULL), TENT_ERR_INVALID_ARGUMENT,
           "out_notification");
    EXPECT(tent_recv_notification(NULL, &n), TENT_ERR_INVALID_ARGUMENT, "engine is NULL");
    EXPECT(tent_recv_notification(e, &n), TENT_OK, "");
    CHECK(strcmp(n.from, me) == 0 && strcmp(n.name, long_name) == 0);
    CHECK(n.msg_len == TENT_MAX_NOTIFY_MSG && n.msg[0] == 0);
    EXPECT(tent_wait_notification(e, 1000, &n), TENT_OK, "");
    CHECK(strcmp(n.name, "two") == 0 && n.msg_len == 2 && n.msg[0] == 0 && n.msg[1] == 9);
    EXPECT(tent_recv_notification(e, &n), TENT_ERR_TIMEOUT, "no notification");

    /* Attached to a submission: delivered once its data landed. */
    tent_batch_id_t batch;
    EXPECT(tent_allocate_batch(e, 2, &batch), TENT_OK, "");
    tent_request_t r = local_write(a, b, 0, 256);
    EXPECT(tent_submit_with_notification(e, batch, &r, 1, NULL, NULL, 0),
           TENT_ERR_INVALID_ARGUMENT, "name is NULL");
    EXPECT(tent_submit_with_notification(e, batch, NULL, 0, "after", NULL, 0),
           TENT_ERR_INVALID_ARGUMENT, "at least one request");
    EXPECT(tent_submit_with_notification(e, batch, &r, 1, long_name, big, sizeof big),
           TENT_ERR_INVALID_ARGUMENT, "exceeds");
    tent_request_t mixed[2] = {local_write(a, b, 0, 64), local_write(a, b, 64, 64)};
    mixed[1].target_id = 4242;
    EXPECT(tent_submit_with_notification(e, batch, mixed, 2, "after", NULL, 0),
           TENT_ERR_INVALID_ARGUMENT, "one segment");
    r.length = 0;
    EXPECT(tent_submit_with_notification(e, batch, &r, 1, "after", NULL, 0),
           TENT_ERR_INVALID_ARGUMENT, "request 0");
    size_t count = 9;
    EXPECT(tent_task_status_list(e, batch, NULL, 0, &count), TENT_OK, "");
    CHECK(count == 0); /* nothing of the refused calls was queued */
    memset(a->addr, 0x3c, 256);
    r = local_write(a, b, 0, 256);
    EXPECT(tent_submit_with_notification(e, batch, &r, 1, "after", "x", 1), TENT_OK, "");
    tent_status_t s;
    EXPECT(tent_wait_batch(e, batch, 10000, &s), TENT_OK, "");
    CHECK(s.state == TENT_STATUS_COMPLETED && s.transferred_bytes == 256);
    EXPECT(tent_wait_notification(e, 10000, &n), TENT_OK, "");
    CHECK(strcmp(n.name, "after") == 0 && n.msg_len == 1 && n.msg[0] == 'x');
    CHECK(memcmp(a->addr, b->addr, 256) == 0);
    EXPECT(tent_free_batch(e, batch), TENT_OK, "");

    /* A second engine: by the shm name a segment carries no notification
     * (they travel on the control plane); by ip:port it does. */
    tent_engine_t *e2 = NULL;
    EXPECT(tent_engine_create(CONFIG, &e2), TENT_OK, "");
    char shm[TENT_SEGMENT_NAME_SIZE], other[TENT_SEGMENT_NAME_SIZE];
    EXPECT(tent_local_segment_name(e, shm, sizeof shm), TENT_OK, "");
    EXPECT(tent_segment_name(e2, other, sizeof other), TENT_OK, "");
    tent_segment_id_t by_shm, by_name;
    EXPECT(tent_open_segment(e2, shm, &by_shm), TENT_OK, "");
    EXPECT(tent_send_notification(e2, by_shm, "hello", NULL, 0), TENT_ERR_INVALID_ARGUMENT,
           "shm name");
    EXPECT(tent_open_segment(e2, me, &by_name), TENT_OK, "");
    CHECK(by_name != by_shm);
    EXPECT(tent_send_notification(e2, by_name, "hello", "from e2", 7), TENT_OK, "");
    EXPECT(tent_wait_notification(e, 10000, &n), TENT_OK, "");
    CHECK(strcmp(n.from, other) == 0 && strcmp(n.name, "hello") == 0 && n.msg_len == 7);
    EXPECT(tent_recv_notification(e2, &n), TENT_ERR_TIMEOUT, "no notification");
    tent_engine_destroy(e2);
}

/* Block lists, within this process (segment 0). */
static void blocks(tent_engine_t *e, const tent_buffer_t *a, const tent_buffer_t *b) {
    tent_batch_id_t batch;
    EXPECT(tent_allocate_batch(e, 4, &batch), TENT_OK, "");
    size_t tasks = 99;
    EXPECT(tent_submit_blocks(e, batch, NULL, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "blocks is NULL");
    EXPECT(tent_submit_blocks(NULL, batch, NULL, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "engine is NULL");
    tent_block_list_t list;
    memset(&list, 0, sizeof list);
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "block list");
    list.block_len = 1024;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT, "no blocks");
    list.count = 4;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "local_addrs is NULL");
    uint64_t local[4], remote[4];
    char stack[4096];
    for (int i = 0; i < 4; i++) {
        local[i] = (uint64_t)(uintptr_t)stack + i * 1024;
        remote[i] = (uint64_t)(uintptr_t)b->addr + i * 1024;
    }
    list.local_addrs = local;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "remote_addrs is NULL");
    list.remote_addrs = remote;
    list.opcode = 9;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT, "opcode 9");
    list.opcode = TENT_OPCODE_WRITE;
    list.priority = 5;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "priority 5");
    list.priority = TENT_PRIORITY_MEDIUM;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_ADDRESS_NOT_REGISTERED,
           "block list");
    for (int i = 0; i < 4; i++) local[i] = (uint64_t)(uintptr_t)a->addr + 65536 - 512 - 1024 * i;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_OUT_OF_BOUNDS, "block list");
    CHECK(tasks == 99);

    /* Contiguous on both sides: one task. Reversed: one task too (one
     * registration), four runs. */
    for (int i = 0; i < 4; i++) {
        local[i] = (uint64_t)(uintptr_t)a->addr + i * 1024;
        memset((char *)a->addr + i * 1024, 0x40 + i, 1024);
    }
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_OK, "");
    CHECK(tasks == 1);
    for (int i = 0; i < 4; i++) {
        local[i] = (uint64_t)(uintptr_t)a->addr + (3 - i) * 1024;
        remote[i] = (uint64_t)(uintptr_t)b->addr + 4096 + (3 - i) * 1024;
    }
    list.count = 3;
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_OK, "");
    CHECK(tasks == 1);
    /* A batch with no room left refuses a list and queues nothing. */
    tent_batch_id_t full;
    EXPECT(tent_allocate_batch(e, 1, &full), TENT_OK, "");
    EXPECT(tent_submit_blocks(e, full, &list, NULL), TENT_OK, "");
    EXPECT(tent_submit_blocks(e, full, &list, NULL), TENT_ERR_INVALID_ARGUMENT, "overflow");
    tent_status_t fs;
    EXPECT(tent_wait_batch(e, full, 10000, &fs), TENT_OK, "");
    CHECK(fs.state == TENT_STATUS_COMPLETED && fs.transferred_bytes == 3 * 1024);
    EXPECT(tent_free_batch(e, full), TENT_OK, "");
    tent_status_t s;
    EXPECT(tent_wait_batch(e, batch, 10000, &s), TENT_OK, "");
    CHECK(s.state == TENT_STATUS_COMPLETED && s.transferred_bytes == 7 * 1024);
    CHECK(memcmp(a->addr, b->addr, 4096) == 0);
    CHECK(memcmp((char *)a->addr + 1024, (char *)b->addr + 4096 + 1024, 3072) == 0);
    EXPECT(tent_free_batch(e, batch), TENT_OK, "");
    EXPECT(tent_submit_blocks(e, batch, &list, &tasks), TENT_ERR_INVALID_ARGUMENT,
           "not allocated");
}

/* A ring outliving its engine: every call says the engine shut down. */
static void closed_engine(void) {
    tent_engine_t *e = NULL;
    EXPECT(tent_engine_create(CONFIG, &e), TENT_OK, "");
    tent_ring_t *ring = NULL;
    EXPECT(tent_ring_create(e, 0, &ring), TENT_OK, "");
    tent_engine_destroy(e);
    size_t n = 99;
    EXPECT(tent_ring_submit(ring, &n), TENT_ERR_SHUTDOWN, "stopped");
    EXPECT(tent_ring_wait(ring, 1000), TENT_ERR_SHUTDOWN, "stopped");
    tent_cqe_t cqe;
    EXPECT(tent_ring_reap(ring, &cqe, 1, &n), TENT_OK, "");
    CHECK(n == 0);
    tent_ring_destroy(ring);
}

static void messages(void) {
    CHECK(strcmp(tent_error_name(TENT_OK), "Ok") == 0);
    CHECK(strcmp(tent_error_name(TENT_ERR_INVALID_ARGUMENT), "InvalidArgument") == 0);
    CHECK(strcmp(tent_error_name(TENT_ERR_SHUTDOWN), "Shutdown") == 0);
    CHECK(strcmp(tent_error_name(TENT_ERR_PANIC), "Panic") == 0);
    CHECK(strcmp(tent_error_name(12345), "Unknown") == 0);
    /* The message names the function, the kind, and the cause. */
    tent_engine_t *e = NULL;
    EXPECT(tent_engine_create(CONFIG, NULL), TENT_ERR_INVALID_ARGUMENT, "");
    CHECK(strcmp(tent_last_error_message(),
                 "tent_engine_create: InvalidArgument: out_engine (an out-pointer) is NULL") ==
          0);
    /* A successful call leaves it (like errno). */
    EXPECT(tent_engine_create(CONFIG, &e), TENT_OK, "");
    CHECK(strstr(tent_last_error_message(), "out_engine") != NULL);
    tent_engine_destroy(e);
}

int main(void) {
    /* The library this program loaded implements the header it was built with. */
    CHECK(tent_abi_version() == TENT_ABI_VERSION);
    engines();
    messages();
    tent_engine_t *e = NULL;
    EXPECT(tent_engine_create(CONFIG, &e), TENT_OK, "");
    if (e == NULL) return 1;
    names(e);
    segments(e);
    tent_buffer_t a, b;
    memory(e, &a, &b);
    requests(e, &a, &b);
    rings(e, &a, &b);
    notifications(e, &a, &b);
    blocks(e, &a, &b);
    EXPECT(tent_unregister_memory(e, a.region_id), TENT_OK, "");
    EXPECT(tent_unregister_memory(e, a.region_id), TENT_ERR_ADDRESS_NOT_REGISTERED,
           "not registered");
    /* Unregistered: requests naming it are refused at the boundary. */
    tent_request_t r = local_write(&a, &b, 0, 64);
    tent_batch_id_t batch;
    EXPECT(tent_allocate_batch(e, 1, &batch), TENT_OK, "");
    EXPECT(tent_submit(e, batch, &r, 1), TENT_ERR_ADDRESS_NOT_REGISTERED, "request 0");
    EXPECT(tent_free_batch(e, batch), TENT_OK, "");
    EXPECT(tent_unregister_memory(e, b.region_id), TENT_OK, "");
    tent_engine_destroy(e);
    closed_engine();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
