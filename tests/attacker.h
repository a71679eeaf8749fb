/*
 * attacker.h — a malicious but enrolled site, for the adversary suite
 * (tests/integration/test_adversary.c). It holds a real certificate of the
 * federation and talks to a real coordinator through net/ directly,
 * choosing every field a site sends — upload ids, token counts, codecs,
 * purposes, offsets — and its timing: streams it opens and never finishes,
 * calls it piles up. Every future change to the coordinator is tried
 * against it.
 */
#ifndef STRAIT_TESTS_ATTACKER_H
#define STRAIT_TESTS_ATTACKER_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"
#include "net/net.h"

/* A site of federation `fed` (its home folder) at addr, enrolled and joined
 * in-process into site_dir. */
void attacker_enroll(const char *fed, const char *addr, const char *name, const char *site_dir);
/* A mutual-TLS channel with the site's certificate. */
NetChannel *attacker_channel(const char *site_dir, const char *addr);

/* What an update claims beside its bytes. */
typedef struct AttackClaim {
    uint64_t round;
    const char *upload_id;
    uint64_t tokens;
    const char *purpose; /* NULL: "update" */
    uint64_t steps;      /* inner steps claimed; 0: none */
    const uint8_t *base; /* SHA-256 of the model it claims to have trained from; NULL: none */
    double eval_loss;    /* the held-out loss it reports; 0: 3.0 */
    uint64_t train_ms, download_ms; /* where it says its round went; 0: not sent */
} AttackClaim;
/* The rest of what an update's metadata claims, for attacker_push_more. */
typedef struct AttackMore {
    uint64_t decode_ms, eval_ms, encode_ms; /* 0: not sent */
    double train_loss;                      /* 0: 3.0 */
    double start_eval_loss;                 /* 0: not sent */
} AttackMore;

/* A whole PushUpdate (with the resume query), as a site would send it. */
NetStatus attacker_push(NetChannel *ch, const AttackClaim *claim, const Blob *b, char *details,
                        size_t details_len);
/* The same, claiming more in its metadata. */
NetStatus attacker_push_more(NetChannel *ch, const AttackClaim *claim, const AttackMore *more,
                             const Blob *b, char *details, size_t details_len);
/* Opens a PushUpdate and sends only its header (declaring len bytes of
 * sha256 at offset 0); the stream stays open for attacker_stream_rest. */
NetClientCall *attacker_open(NetChannel *ch, const AttackClaim *claim, const Blob *b);
/* Streams b's chunks from offset `from` on an opened call and finishes it. */
NetStatus attacker_stream_rest(NetClientCall *c, const Blob *b, uint64_t from, char *details,
                               size_t details_len);
/* On an opened call, sends b's bytes `step` at a time, one send every
 * interval_ms, for at most `sends` sends, then finishes: a trickle.
 * *sent gets the bytes sent (may be NULL). */
NetStatus attacker_trickle(NetClientCall *c, const Blob *b, size_t step, int interval_ms, int sends,
                           uint64_t *sent, char *details, size_t details_len);
/* QueryUpload: how much of upload_id the coordinator says it holds. */
uint64_t attacker_query(NetChannel *ch, const char *upload_id);

/* An update of the tiny model in the federation's codec: every value v
 * (or a gentle pattern of size scale when v is 0). */
Blob attacker_update(const char *codec, uint64_t table_hash, uint64_t n, float v, float scale);
/* The n values x as an update in the codec: one aimed anywhere. */
Blob attacker_encode(const char *codec, uint64_t table_hash, const float *x, uint64_t n);

/* One Heartbeat for `round` (state "training"), as a site sends it. With
 * NET_OK and out non-NULL, *out gets the answer: the round the coordinator
 * is at, whether it has finished, whether the caller's update is in the
 * open round. */
typedef struct AttackBeat {
    uint64_t current_round;
    int finished, reported;
} AttackBeat;
NetStatus attacker_heartbeat(NetChannel *ch, uint64_t round, int64_t timeout_ms, AttackBeat *out,
                             char *details, size_t details_len);

#endif
