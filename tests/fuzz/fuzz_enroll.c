/*
 * fuzz_enroll.c — libFuzzer target for the enrollment listener's frames
 * (net/enroll.c), the first bytes the coordinator reads from a peer with no
 * certificate, and the answer a joining site reads back. Whatever the
 * bytes, no crash and no read past them; a frame is whole at one length
 * only (longer, it has bytes after it), no prefix of a frame is an error,
 * and a whole one names a body inside the bytes and within its bounds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a copy of exactly size bytes: ASan sees any read past them */
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL) return 0;
    memcpy(buf, data, size);
    size_t max = NET_ENROLL_REQUEST_DEFAULT, body = 0;
    int whole = net_enroll_request_parse(buf, size, max, &body);
    if (whole == 1 && (body == 0 || body > max || 8 + body != size)) abort();
    for (size_t have = 0; have < size; have++) {
        size_t b = 0;
        int r = net_enroll_request_parse(buf, have, max, &b);
        if (r == 1 && whole != -1) abort(); /* whole sooner: then bytes after it at size */
        if (whole >= 0 && r < 0) abort();   /* a prefix of a frame is no error */
    }
    NetStatus st = NET_OK;
    whole = net_enroll_answer_parse(buf, size, &st, &body);
    if (whole == 1 &&
        (body > NET_ENROLL_ANSWER_MAX || 9 + body != size || (unsigned)st > NET_UNAUTHENTICATED))
        abort();
    for (size_t have = 0; have < size; have++) {
        size_t b = 0;
        NetStatus s2;
        int r = net_enroll_answer_parse(buf, have, &s2, &b);
        if ((r == 1 && whole != -1) || (whole >= 0 && r < 0)) abort();
    }
    free(buf);
    return 0;
}
