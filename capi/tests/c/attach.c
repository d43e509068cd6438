/* An engine attached to a daemon through the C API (tests/c_attach.rs
 * runs it): attach at argv[1], allocate memory there and fill it with
 * bytes (i * 7 + 3) & 0xff, WRITE it to segment argv[2] at address
 * argv[3] through a ring and then a batch (the last with a notification),
 * and check what an attached engine refuses. Prints "ok" when every step
 * did what it should. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent.h"

#define LEN (256u * 1024u)

static int fail(const char *what, int rc) {
    fprintf(stderr, "%s: %d %s\n", what, rc, tent_last_error_message());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <socket> <segment> <address>\n", argv[0]);
        return 2;
    }
    tent_engine_t *e = NULL;
    int rc = tent_engine_attach("/nonexistent/tentd.sock", &e);
    if (rc != TENT_ERR_UNREACHABLE || e != NULL) {
        return fail("attach to no daemon", rc);
    }
    if ((rc = tent_engine_attach(argv[1], &e)) != TENT_OK) {
        return fail("tent_engine_attach", rc);
    }
    tent_buffer_t buf;
    if ((rc = tent_allocate_memory(e, LEN, &buf)) != TENT_OK) {
        return fail("tent_allocate_memory", rc);
    }
    unsigned char *p = buf.addr;
    for (uint32_t i = 0; i < LEN; i++) {
        p[i] = (unsigned char)((i * 7 + 3) & 0xff);
    }
    tent_segment_id_t seg;
    if ((rc = tent_open_segment(e, argv[2], &seg)) != TENT_OK) {
        return fail("tent_open_segment", rc);
    }
    tent_ring_t *ring = NULL;
    if ((rc = tent_ring_create(e, 64, &ring)) != TENT_OK) {
        return fail("tent_ring_create", rc);
    }
    tent_request_t req;
    memset(&req, 0, sizeof req);
    req.opcode = TENT_OPCODE_WRITE;
    req.source = buf.addr;
    req.target_id = seg;
    req.target_offset = strtoull(argv[3], NULL, 10);
    req.length = LEN;
    req.user_data = 42;
    if ((rc = tent_ring_push(ring, e, &req, 1, NULL)) != TENT_OK) {
        return fail("tent_ring_push", rc);
    }
    if ((rc = tent_ring_wait(ring, 10000)) != TENT_OK) {
        return fail("tent_ring_wait", rc);
    }
    tent_cqe_t cqe;
    size_t n = 0;
    if ((rc = tent_ring_reap(ring, &cqe, 1, &n)) != TENT_OK || n != 1) {
        return fail("tent_ring_reap", rc);
    }
    if (cqe.user_data != 42 || cqe.result != (int64_t)LEN) {
        fprintf(stderr, "cqe: user_data %" PRIu64 " result %" PRId64 "\n", cqe.user_data,
                cqe.result);
        return 1;
    }
    /* The batch API: the same WRITE again, as a batch. */
    tent_batch_id_t batch;
    if ((rc = tent_allocate_batch(e, 4, &batch)) != TENT_OK) {
        return fail("tent_allocate_batch", rc);
    }
    if ((rc = tent_submit(e, batch, &req, 1)) != TENT_OK) {
        return fail("tent_submit", rc);
    }
    tent_status_t st;
    if ((rc = tent_wait_batch(e, batch, 10000, &st)) != TENT_OK) {
        return fail("tent_wait_batch", rc);
    }
    if (st.state != TENT_STATUS_COMPLETED || st.transferred_bytes != LEN) {
        fprintf(stderr, "batch: state %d bytes %" PRIu64 "\n", st.state, st.transferred_bytes);
        return 1;
    }
    /* Heap memory and cancel are refused, typed. */
    static unsigned char heap[4096];
    tent_buffer_t h;
    if ((rc = tent_register_memory(e, heap, sizeof heap, &h)) != TENT_ERR_INVALID_ARGUMENT) {
        return fail("tent_register_memory on an attached engine", rc);
    }
    if ((rc = tent_cancel(e, batch)) != TENT_ERR_INVALID_ARGUMENT) {
        return fail("tent_cancel on an attached engine", rc);
    }
    if ((rc = tent_free_batch(e, batch)) != TENT_OK) {
        return fail("tent_free_batch", rc);
    }
    /* A notification to the target, after a batch's data: the test sees
     * it arrive from this engine's mailbox name. */
    if ((rc = tent_allocate_batch(e, 4, &batch)) != TENT_OK) {
        return fail("tent_allocate_batch", rc);
    }
    if ((rc = tent_submit_with_notification(e, batch, &req, 1, "from-c", "done", 4)) != TENT_OK) {
        return fail("tent_submit_with_notification", rc);
    }
    if ((rc = tent_wait_batch(e, batch, 10000, &st)) != TENT_OK ||
        st.state != TENT_STATUS_COMPLETED) {
        return fail("tent_wait_batch after a notification", rc);
    }
    if ((rc = tent_free_batch(e, batch)) != TENT_OK) {
        return fail("tent_free_batch", rc);
    }
    /* Peers name this engine's memory where the daemon maps it. */
    if (buf.peer_addr == 0) {
        fprintf(stderr, "peer_addr is 0\n");
        return 1;
    }
    tent_ring_destroy(ring);
    tent_engine_destroy(e);
    printf("ok\n");
    return 0;
}
