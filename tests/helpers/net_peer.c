/*
 * net_peer.c — a client process for the transport tests, so that a test can
 * kill a real uploader with SIGKILL and resume in a new one.
 *
 *   net_peer upload TARGET CA_PEM CERT_PEM KEY_PEM UPLOAD_ID BYTES SEED [CHUNK]
 *
 * Uploads BYTES deterministic bytes (harness_fill with SEED) to
 * /strait.Test/Upload, asking /strait.Test/Query where to resume. Prints
 * "resumed_from=N status=NAME" and exits 0 on OK, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"
#include "tests/harness.h"
#include "util/util.h"

int main(int argc, char **argv) {
    if (argc < 9 || strcmp(argv[1], "upload") != 0) {
        fprintf(stderr, "usage: net_peer upload TARGET CA CERT KEY ID BYTES SEED [CHUNK]\n");
        return 2;
    }
    net_global_init();
    char err[ERR_LEN], *ca, *cert, *key;
    if (file_read_all(argv[3], 1 << 20, &ca, NULL, err) ||
        file_read_all(argv[4], 1 << 20, &cert, NULL, err) ||
        file_read_all(argv[5], 1 << 20, &key, NULL, err)) {
        fprintf(stderr, "net_peer: %s\n", err);
        return 1;
    }
    size_t n = (size_t)strtoull(argv[7], NULL, 10);
    uint8_t *data = malloc(n);
    harness_fill(data, n, strtoull(argv[8], NULL, 10));
    NetChannelConfig cc = {argv[2], {ca, cert, key}, NULL, 0, 0};
    NetChannel *ch = net_channel_create(&cc, err);
    if (ch == NULL) {
        fprintf(stderr, "net_peer: %s\n", err);
        return 1;
    }
    NetTransferSpec spec = {"test", 1, argv[6], argc > 9 ? (uint32_t)atoi(argv[9]) : 0,
                            NULL,   0, NULL};
    uint64_t from = 0;
    char details[512] = "";
    NetStatus st = net_upload(ch, "/strait.Test/Upload", "/strait.Test/Query", &spec, data, n,
                              120000, &from, details, sizeof details);
    printf("resumed_from=%llu status=%s %s\n", (unsigned long long)from, net_status_name(st),
           details);
    fflush(stdout);
    net_channel_destroy(ch);
    free(data), free(ca), free(cert), free(key);
    net_global_shutdown();
    return st == NET_OK ? 0 : 1;
}
