/*
 * aggregate.c — what the coordinator does with the sites' updates: a
 * streaming weighted sum with the sanity gates (table, size, finite values,
 * norm against the round's median), the robust alternatives (coordinate-wise
 * median and trimmed mean, block by block over spooled updates), and the
 * outer optimizers.
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include <stdio.h>

#include "coordinator.h"
#include "util/util.h"

/* ---- streaming weighted sum ------------------------------------------------------ */

/* A process-wide count, so that a gen is never reused by another sum. */
static uint64_t next_gen(void) {
    static _Atomic uint64_t gen = 0;
    return ++gen;
}

int round_sum_init(RoundSum *rs, uint64_t n, uint64_t table_hash, double norm_gate, char *err) {
    memset(rs, 0, sizeof *rs);
    if (n == 0 || n > CODEC_MAX_ELEMENTS)
        return err_set(err, "bad model size %llu", (unsigned long long)n);
    rs->sum = calloc(n, sizeof(float));
    mem_prefer_huge_pages(rs->sum, sizeof(float) * n);
    rs->pool = codec_checked_new();
    if (rs->sum == NULL || rs->pool == NULL) {
        round_sum_free(rs);
        return err_set(err, "out of memory for the round's sum");
    }
    rs->n = n;
    rs->table_hash = table_hash;
    rs->norm_gate = norm_gate;
    rs->gate_min = 2;
    rs->gen = next_gen();
    return 0;
}

void round_sum_free(RoundSum *rs) {
    free(rs->sum);
    free(rs->stage);
    free(rs->norms);
    codec_checked_free(rs->pool);
    memset(rs, 0, sizeof *rs);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double round_median(const double *v, int n, int lower) {
    if (n <= 0) return NAN;
    double *c = malloc(sizeof(double) * (size_t)n);
    if (c == NULL) return NAN;
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : lower ? c[n / 2 - 1] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

static double median_of(const double *v, int n) {
    double m = round_median(v, n, 0);
    return isnan(m) ? 0 : m;
}

/* The update's own checks (codec_blob_check: header, sections, checksums,
 * finite values; then the model it is for), keeping what was checked. */
int round_gate_inspect(uint64_t n, uint64_t table_hash, const uint8_t *blob, size_t len,
                       CodecChecked *pool, RoundGate *g) {
    memset(g, 0, sizeof *g);
    g->checked = pool ? pool : codec_checked_new();
    g->owns_checked = pool == NULL;
    if (g->checked == NULL) {
        g->code = "internal";
        snprintf(g->why, sizeof g->why, "out of memory inspecting the update");
        return 1;
    }
    BlobInfo info;
    char reason[ERR_LEN];
    int rc = codec_blob_check(blob, len, 0, 0, &info, g->checked, reason);
    if (rc != 0) {
        g->code = rc == CODEC_NON_FINITE ? "non_finite" : "malformed";
        snprintf(g->why, sizeof g->why, "%.250s", reason);
        round_gate_free(g);
        return 1;
    }
    g->norm = sqrt(info.norm2);
    if (info.table_hash != table_hash || info.n != n) {
        g->code = "wrong_model";
        snprintf(g->why, sizeof g->why,
                 "blob is for parameter table %016llx with %llu values; this model's is %016llx "
                 "with %llu",
                 (unsigned long long)info.table_hash, (unsigned long long)info.n,
                 (unsigned long long)table_hash, (unsigned long long)n);
        round_gate_free(g);
        return 1;
    }
    return 0;
}

/* The stage, taken on first use when the machine has eight times its size
 * available: the sum's own pages (calloc's, untouched until the first add),
 * the commit's next θ, its encoded downlink and files come after it, and a
 * coordinator near the machine's memory (GPT-2 large's six fp32 updates on
 * 24 GiB: already six times the model at its peak) must read its updates
 * twice rather than be killed for memory. NULL: none. */
static float *stage_of(RoundSum *rs) {
    if (rs->stage == NULL && mem_available() >= 8.0 * sizeof(float) * (double)rs->n) {
        rs->stage = malloc(sizeof(float) * rs->n);
        mem_prefer_huge_pages(rs->stage, sizeof(float) * rs->n);
    }
    return rs->stage;
}

int round_sum_inspect_add(RoundSum *rs, const uint8_t *blob, size_t len, double weight,
                          CodecChecked *pool, RoundGate *g) {
    if (pool == NULL) pool = rs->pool;
    float *stage = weight > 0 && isfinite(weight) ? stage_of(rs) : NULL;
    if (stage == NULL) return round_gate_inspect(rs->n, rs->table_hash, blob, len, pool, g);
    memset(g, 0, sizeof *g);
    g->checked = pool;
    BlobInfo info;
    char reason[ERR_LEN];
    int rc = codec_blob_check_add(blob, len, rs->table_hash, rs->n, (float)weight,
                                  rs->touched ? rs->sum : NULL, stage, &info, g->checked, reason);
    if (rc != 0) {
        g->code = rc == CODEC_NON_FINITE    ? "non_finite"
                  : rc == CODEC_WRONG_MODEL ? "wrong_model"
                                            : "malformed";
        snprintf(g->why, sizeof g->why, "%.250s", reason);
        g->checked = NULL;
        return 1;
    }
    g->norm = sqrt(info.norm2);
    g->staged = 1, g->staged_gen = rs->gen, g->staged_weight = weight;
    return 0;
}

void round_gate_free(RoundGate *g) {
    if (g->owns_checked) codec_checked_free(g->checked);
    g->checked = NULL;
    g->owns_checked = 0;
}

/* The round's gates on an inspected update: the weight, the absolute norm
 * bound (from the first update on), and the norm against the median of the
 * updates accepted before it (never counting itself). */
int round_sum_judge(const RoundSum *rs, double weight, RoundGate *g) {
    assert(g->code != NULL || g->checked != NULL); /* inspected, and it passed */
    if (g->code != NULL) return 1;
    double norm = g->norm;
    if (!(weight > 0) || !isfinite(weight)) {
        g->code = "bad_weight";
        snprintf(g->why, sizeof g->why, "update weight %g (tokens trained) must be positive",
                 weight);
    } else if (rs->max_norm > 0 && !(norm <= rs->max_norm)) {
        g->code = "norm_gate";
        snprintf(g->why, sizeof g->why, "update norm %.4g is over the federation's bound %.4g",
                 norm, rs->max_norm);
    } else if (rs->norm_gate > 0 && rs->accepted >= rs->gate_min) {
        double med = median_of(rs->norms, rs->accepted);
        if (med > 0 && norm > rs->norm_gate * med) {
            g->code = "norm_gate";
            snprintf(g->why, sizeof g->why,
                     "update norm %.4g is over %.3g x the round's median %.4g", norm, rs->norm_gate,
                     med);
        }
    }
    return g->code != NULL;
}

int round_sum_gate(const RoundSum *rs, const uint8_t *blob, size_t len, double weight,
                   RoundGate *g) {
    if (round_gate_inspect(rs->n, rs->table_hash, blob, len, rs->pool, g) != 0) return 1;
    return round_sum_judge(rs, weight, g);
}

int round_sum_apply(RoundSum *rs, const RoundGate *g, double weight, int accumulate, char *err) {
    assert(g->code == NULL && g->checked != NULL);
    if (rs->accepted == rs->norms_cap) {
        int cap = rs->norms_cap ? 2 * rs->norms_cap : 16;
        double *grown = realloc(rs->norms, sizeof(double) * (size_t)cap);
        if (grown == NULL) return err_set(err, "out of memory");
        rs->norms = grown;
        rs->norms_cap = cap;
    }
    if (accumulate && g->staged && g->staged_gen == rs->gen && g->staged_weight == weight &&
        rs->stage != NULL) {
        float *was = rs->sum;
        rs->sum = rs->stage, rs->stage = was;
    } else if (accumulate) {
        codec_checked_accumulate(g->checked, (float)weight, rs->sum, !rs->touched);
    }
    if (accumulate) rs->gen = next_gen();
    rs->touched |= accumulate;
    rs->norms[rs->accepted++] = g->norm;
    rs->weight += weight;
    return 0;
}

static int gate_then_apply(RoundSum *rs, const uint8_t *blob, size_t len, double weight,
                           int accumulate, char *why) {
    RoundGate g;
    int refused = accumulate ? round_sum_inspect_add(rs, blob, len, weight, NULL, &g) != 0 ||
                                   round_sum_judge(rs, weight, &g) != 0
                             : round_sum_gate(rs, blob, len, weight, &g) != 0;
    int rc = 1;
    if (refused)
        err_set(why, "%s", g.why);
    else
        rc = round_sum_apply(rs, &g, weight, accumulate, why);
    round_gate_free(&g);
    return rc;
}

int round_sum_check(RoundSum *rs, const uint8_t *blob, size_t len, double weight, char *why) {
    return gate_then_apply(rs, blob, len, weight, 0, why);
}

int round_sum_add(RoundSum *rs, const uint8_t *blob, size_t len, double weight, char *why) {
    return gate_then_apply(rs, blob, len, weight, 1, why);
}

void round_sum_restart(RoundSum *rs) {
    rs->touched = 0, rs->weight = 0, rs->accepted = 0;
    rs->gen = next_gen();
    rs->norm_gate = 0, rs->max_norm = 0;
}

int round_sum_mean(const RoundSum *rs, float *mean, char *err) {
    if (rs->accepted == 0 || !(rs->weight > 0)) return err_set(err, "no update was accepted");
    codec_scale(rs->sum, rs->n, (float)(1.0 / rs->weight), mean);
    return 0;
}

/* ---- robust aggregation ------------------------------------------------------------- */

/* A column of one value per update, sorted, for the few updates a round
 * usually has: insertion sort, no call per comparison. */
static void sort_column(float *col, int n) {
    for (int i = 1; i < n; i++) {
        float v = col[i];
        int j = i - 1;
        for (; j >= 0 && col[j] > v; j--) col[j + 1] = col[j];
        col[j + 1] = v;
    }
}

/* Rearranges v[0..n) so that v[k] is its k-th smallest, with nothing
 * larger before it and nothing smaller after it (Hoare's selection with a
 * median-of-three pivot: deterministic, O(n) on average). v is finite. */
static void select_kth(float *v, int n, int k) {
    assert(k >= 0 && k < n);
    int lo = 0, hi = n - 1;
    while (hi > lo) {
        float a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi];
        float pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return; /* between: equal to the pivot */
    }
}

/* Above this many updates a column is selected, not sorted: a sort's
 * n²/4 moves grow past selection's few passes (64 updates: 5x). */
#define SORT_MAX 24

/* The median of col (reordered): the middle value, or the mean of the two. */
static float column_median(float *col, int n) {
    if (n <= SORT_MAX) {
        sort_column(col, n);
        return n % 2 ? col[n / 2] : 0.5f * (col[n / 2 - 1] + col[n / 2]);
    }
    int k = n / 2;
    select_kth(col, n, k);
    if (n % 2) return col[k];
    float below = col[0]; /* the largest of the lower half */
    for (int i = 1; i < k; i++) below = col[i] > below ? col[i] : below;
    return 0.5f * (below + col[k]);
}

/* The mean of col without its drop smallest and drop largest (reordered),
 * summed in double. */
static float column_trimmed_mean(float *col, int n, int drop) {
    int keep = n - 2 * drop;
    if (n <= SORT_MAX) {
        sort_column(col, n);
    } else if (drop > 0) {
        select_kth(col, n, drop);               /* the drop smallest before it */
        select_kth(col + drop, n - drop, keep); /* the drop largest after the kept */
    }
    double s = 0;
    for (int u = drop; u < drop + keep; u++) s += col[u];
    return (float)(s / keep);
}

/* ---- a few updates: columns sorted side by side ------------------------------------ */

/* Up to SORT_MAX updates, a block's columns are sorted together by a
 * sorting network (Batcher's odd-even merge sort over 32 slots, keeping the
 * comparators inside n: the slots past n hold +inf and never move), each
 * comparator a min and a max across a run of coordinates in vector lanes,
 * with no branch on the data. It orders each column
 * as the insertion sort does (ties are equal floats), so a rule's result
 * from the sorted rows is the column function's, float for float. */
typedef struct Comparator {
    uint8_t lo, hi;
} Comparator;

#define NETWORK_SLOTS 32
#define NETWORK_MAX   191 /* Batcher's network for 32 */

static int network_build(int n, Comparator *cmp) {
    int count = 0;
    for (int p = 1; p < NETWORK_SLOTS; p <<= 1)
        for (int k = p; k >= 1; k >>= 1)
            for (int j = k % p; j + k < NETWORK_SLOTS; j += 2 * k)
                for (int i = 0; i < k && i + j + k < NETWORK_SLOTS; i++)
                    if ((i + j) / (2 * p) == (i + j + k) / (2 * p) && i + j + k < n) {
                        assert(count < NETWORK_MAX);
                        cmp[count++] = (Comparator){(uint8_t)(i + j), (uint8_t)(i + j + k)};
                    }
    return count;
}

/* Runs the network over m coordinates of n rows: four at a time with
 * SSE's min and max (minps(b, a) is b < a ? b : a, maxps(a, b) is
 * b < a ? a : b: the scalar lines' floats), then the rest one by one. */
static void network_sort(const Comparator *cmp, int count, float *const *row, uint32_t m) {
#ifdef __SSE2__
    uint32_t m4 = m & ~3u;
#else
    uint32_t m4 = 0;
#endif
    for (int c = 0; c < count; c++) {
        float *restrict x = row[cmp[c].lo], *restrict y = row[cmp[c].hi];
#ifdef __SSE2__
        for (uint32_t i = 0; i < m4; i += 4) {
            __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(y + i);
            _mm_storeu_ps(x + i, _mm_min_ps(b, a));
            _mm_storeu_ps(y + i, _mm_max_ps(a, b));
        }
#endif
        for (uint32_t i = m4; i < m; i++) {
            float a = x[i], b = y[i];
            x[i] = b < a ? b : a;
            y[i] = b < a ? a : b;
        }
    }
}

/* The rules from sorted rows (row[u][i]: coordinate i's u-th smallest). */
typedef void (*SortedFn)(float *const *row, int n, int drop, uint32_t m, float *out);

static void sorted_median(float *const *row, int n, int drop, uint32_t m, float *out) {
    (void)drop;
    if (n % 2) {
        memcpy(out, row[n / 2], sizeof(float) * m);
        return;
    }
    const float *a = row[n / 2 - 1], *b = row[n / 2];
    for (uint32_t i = 0; i < m; i++) out[i] = 0.5f * (a[i] + b[i]);
}

static void sorted_trimmed_mean(float *const *row, int n, int drop, uint32_t m, float *out) {
    double s[256];
    int keep = n - 2 * drop;
    for (uint32_t i0 = 0; i0 < m; i0 += 256) {
        uint32_t k = m - i0 < 256 ? m - i0 : 256;
        for (uint32_t i = 0; i < k; i++) s[i] = 0;
        for (int u = drop; u < drop + keep; u++) /* in column order, as column_trimmed_mean */
            for (uint32_t i = 0; i < k; i++) s[i] += row[u][i0 + i];
        for (uint32_t i = 0; i < k; i++) out[i0 + i] = (float)(s[i] / keep);
    }
}

/* ---- the rules ------------------------------------------------------------------------ */

/* One row per rule. A coordinate-wise rule combines one coordinate's
 * column of values (one per kept update, its own to reorder; drop is
 * aggregate_trim_count's for rules that trim); the mean streams instead
 * and has none. A new rule is its column function and one row here, plus
 * its name in AggregateRule (and, for speed with a few updates, its rows
 * function). */
typedef float (*ColumnFn)(float *col, int n, int drop);
static float column_median_of(float *col, int n, int drop) {
    (void)drop;
    return column_median(col, n);
}
static const struct {
    AggregateRule rule;
    const char *name;
    int keeps_updates; /* the updates kept whole until the round closes */
    int trims;         /* [rounds] trim applies */
    ColumnFn column;   /* NULL: streamed (RoundSum) */
    SortedFn sorted;   /* the same from sorted rows, for a few updates; NULL: columns only */
} RULES[] = {
    {AGG_MEAN, "mean", 0, 0, NULL, NULL},
    {AGG_MEDIAN, "median", 1, 0, column_median_of, sorted_median},
    {AGG_TRIMMED_MEAN, "trimmed_mean", 1, 1, column_trimmed_mean, sorted_trimmed_mean},
};

#define N_RULES ((int)(sizeof RULES / sizeof RULES[0]))

int aggregate_rule_parse(const char *name, AggregateRule *out) {
    for (int i = 0; i < N_RULES; i++)
        if (strcmp(RULES[i].name, name) == 0) {
            *out = RULES[i].rule;
            return 0;
        }
    return -1;
}

static int rule_row(AggregateRule rule) {
    assert((int)rule >= 0 && (int)rule < N_RULES && RULES[rule].rule == rule);
    return (int)rule;
}

const char *aggregate_rule_name(AggregateRule rule) {
    return RULES[rule_row(rule)].name;
}

int aggregate_rule_keeps_updates(AggregateRule rule) {
    return RULES[rule_row(rule)].keeps_updates;
}

int aggregate_rule_trims(AggregateRule rule) {
    return RULES[rule_row(rule)].trims;
}

int aggregate_trim_count(double trim, int n_updates) {
    int drop = (int)floor(trim * n_updates);
    /* a trim asked for removes at least one from each end once there are
     * three: floor(0.1 x 3) = 0 would make the robust rule a plain mean */
    if (trim > 0 && drop == 0 && n_updates >= 3) drop = 1;
    return drop;
}

/* "mean, median or trimmed_mean": the table's names, built once */
static char rule_names[256];
static void names_build(void) {
    size_t len = 0;
    for (int i = 0; i < N_RULES; i++)
        len += (size_t)snprintf(rule_names + len, sizeof rule_names - len, "%s%s",
                                i == 0             ? ""
                                : i == N_RULES - 1 ? " or "
                                                   : ", ",
                                RULES[i].name);
    assert(len < sizeof rule_names);
}
const char *aggregate_rule_names(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, names_build);
    return rule_names;
}

/* The pages of a map its cursor has read past, let go: the whole pages of
 * [*released, done). */
static void release_read(const uint8_t *map, size_t done, size_t page, size_t *released) {
    size_t end = done / page * page;
    if (end <= *released) return;
    madvise((void *)(map + *released), end - *released, MADV_DONTNEED);
    *released = end;
}

/* robust_aggregate; with released (n_updates long, zeros), over maps whose
 * read pages it lets go, each's released offset kept there. */
static int robust_aggregate_of(const uint8_t *const *blobs, const size_t *lens, int n_updates,
                               uint64_t n, AggregateRule rule, double trim, float *out,
                               size_t *released, char *err) {
    enum { BLOCK = 1 << 16 };
    if (n_updates < 1) return err_set(err, "no updates to aggregate");
    ColumnFn column = RULES[rule_row(rule)].column;
    if (column == NULL)
        return err_set(err, "%s is not a coordinate-wise rule", aggregate_rule_name(rule));
    if (RULES[rule].trims && !(trim >= 0 && trim < 0.5))
        return err_set(err, "trim fraction %g must be in [0, 0.5)", trim);
    float *block = malloc(sizeof(float) * (size_t)BLOCK * (size_t)n_updates);
    /* one cursor per update: each section decoded once, one held at a time */
    CodecCursor **cur = calloc((size_t)n_updates, sizeof *cur);
    char(*why)[ERR_LEN] = calloc((size_t)n_updates, ERR_LEN); /* each cursor's failure */
    if (block == NULL || cur == NULL || why == NULL) {
        free(block), free(cur), free(why);
        return err_set(err, "out of memory for a %d-update block", n_updates);
    }
    for (int u = 0; u < n_updates; u++) {
        if ((cur[u] = codec_cursor_open(blobs[u], lens[u], n, why[u])) == NULL) {
            for (int k = 0; k < u; k++) codec_cursor_close(cur[k]);
            err_set(err, "update %d: %s", u, why[u]);
            free(block), free(cur), free(why);
            return -1;
        }
    }
    int drop = RULES[rule].trims ? aggregate_trim_count(trim, n_updates) : 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    SortedFn sorted = n_updates <= SORT_MAX ? RULES[rule].sorted : NULL;
    Comparator cmp[NETWORK_MAX];
    int n_cmp = sorted ? network_build(n_updates, cmp) : 0;
    int rc = 0;
    /* block by block, with every core: the updates' cursors decode side by
     * side, then each coordinate's column is sorted on its own (a column is
     * one coordinate's values: the result does not depend on the threads) */
    for (uint64_t lo = 0; lo < n && rc == 0; lo += BLOCK) {
        uint64_t hi = lo + BLOCK < n ? lo + BLOCK : n;
        int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
        for (int u = 0; u < n_updates; u++) {
            failed |= codec_cursor_read(cur[u], lo, hi, block + (size_t)u * BLOCK, why[u]) != 0;
            if (released) release_read(blobs[u], codec_cursor_done(cur[u]), page, &released[u]);
        }
        if (failed) {
            for (int u = 0; u < n_updates; u++)
                if (why[u][0]) {
                    rc = err_set(err, "update %d: %s", u, why[u]);
                    break;
                }
            break;
        }
        if (sorted) { /* runs of coordinates, sorted side by side, in place */
#pragma omp parallel for schedule(static)
            for (uint64_t r0 = lo; r0 < hi; r0 += 1024) {
                uint32_t m = (uint32_t)(hi - r0 < 1024 ? hi - r0 : 1024);
                float *row[SORT_MAX];
                for (int u = 0; u < n_updates; u++) row[u] = block + (size_t)u * BLOCK + (r0 - lo);
                network_sort(cmp, n_cmp, row, m);
                sorted(row, n_updates, drop, m, out + r0);
            }
            continue;
        }
#pragma omp parallel reduction(| : failed)
        {
            float *col = malloc(sizeof(float) * (size_t)n_updates);
            failed |= col == NULL;
#pragma omp for schedule(static)
            for (uint64_t i = lo; i < hi; i++) {
                if (col == NULL) continue;
                for (int u = 0; u < n_updates; u++) col[u] = block[(size_t)u * BLOCK + (i - lo)];
                out[i] = column(col, n_updates, drop);
            }
            free(col);
        }
        if (failed) rc = err_set(err, "out of memory for a %d-update column", n_updates);
    }
    for (int u = 0; u < n_updates; u++) codec_cursor_close(cur[u]);
    free(block), free(cur), free(why);
    return rc;
}

int robust_aggregate(const uint8_t *const *blobs, const size_t *lens, int n_updates, uint64_t n,
                     AggregateRule rule, double trim, float *out, char *err) {
    return robust_aggregate_of(blobs, lens, n_updates, n, rule, trim, out, NULL, err);
}

int robust_aggregate_maps(const uint8_t *const *blobs, const size_t *lens, int n_updates,
                          uint64_t n, AggregateRule rule, double trim, float *out, char *err) {
    size_t *released = calloc((size_t)(n_updates > 0 ? n_updates : 1), sizeof *released);
    if (released == NULL) return err_set(err, "out of memory for %d updates", n_updates);
    int rc = robust_aggregate_of(blobs, lens, n_updates, n, rule, trim, out, released, err);
    free(released);
    return rc;
}

/* ---- outer optimizers ---------------------------------------------------------------- */

int outer_kind_parse(const char *name, OuterKind *out) {
    if (strcmp(name, "nesterov") == 0)
        *out = OUTER_NESTEROV;
    else if (strcmp(name, "avg") == 0 || strcmp(name, "fedavg") == 0)
        *out = OUTER_AVG;
    else if (strcmp(name, "adam") == 0 || strcmp(name, "fedadam") == 0)
        *out = OUTER_ADAM;
    else
        return -1;
    return 0;
}

int outer_init(OuterOpt *o, OuterKind kind, uint64_t n, float lr, float momentum, char *err) {
    memset(o, 0, sizeof *o);
    o->kind = kind, o->n = n, o->lr = lr, o->momentum = momentum;
    o->beta1 = 0.9f, o->beta2 = 0.99f, o->eps = 1e-8f;
    if (!(lr > 0)) return err_set(err, "outer learning rate must be positive");
    if (kind == OUTER_AVG) return 0;
    o->b = calloc(n, sizeof(float));
    if (kind == OUTER_ADAM) o->v = calloc(n, sizeof(float));
    if (o->b == NULL || (kind == OUTER_ADAM && o->v == NULL)) {
        outer_free(o);
        return err_set(err, "out of memory for the outer optimizer");
    }
    return 0;
}

void outer_free(OuterOpt *o) {
    free(o->b), free(o->v);
    o->b = o->v = NULL;
}

void outer_step(OuterOpt *o, float *theta, const float *d) {
    o->step++;
    switch (o->kind) {
    case OUTER_AVG: /* θ ← θ − η Δ̄ (η = 1: the sites' mean model) */
        for (uint64_t i = 0; i < o->n; i++) theta[i] -= o->lr * d[i];
        break;
    case OUTER_NESTEROV: /* b ← μb + Δ̄; θ ← θ − η(Δ̄ + μb) */
        for (uint64_t i = 0; i < o->n; i++) {
            o->b[i] = o->momentum * o->b[i] + d[i];
            theta[i] -= o->lr * (d[i] + o->momentum * o->b[i]);
        }
        break;
    case OUTER_ADAM: {
        float bc1 = 1.0f - powf(o->beta1, (float)o->step),
              bc2 = 1.0f - powf(o->beta2, (float)o->step);
        for (uint64_t i = 0; i < o->n; i++) {
            o->b[i] = o->beta1 * o->b[i] + (1.0f - o->beta1) * d[i];
            o->v[i] = o->beta2 * o->v[i] + (1.0f - o->beta2) * d[i] * d[i];
            theta[i] -= o->lr * (o->b[i] / bc1) / (sqrtf(o->v[i] / bc2) + o->eps);
        }
        break;
    }
    }
}
