/*
 * home.c — the federation's home folder: `strait init` (CA, server and
 * admin certificates, federation.ini, the store), its facts (CA
 * fingerprint, advertised address), enrollment tokens and revocation.
 *
 * Keys are written 0600 with util's atomic writes; an existing federation
 * is never overwritten without force.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "kernels/gguf.h"
#include "net/net.h"
#include "security/security.h"
#include "util/util.h"

int coordinator_valid_site_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 64) return 0;
    /* not '.', '..', or a name a shell or a file system reads as something else */
    if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z') ||
          (name[0] >= '0' && name[0] <= '9')))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

int coordinator_check_listen(const char *hostport, char *err) {
    const char *colon = strrchr(hostport, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon == hostport || colon[1] == '\0' || *end != '\0' || port < 0 ||
        port > 65535 || (colon - hostport) > 253)
        return err_set(err, "address '%.80s' is not HOST:PORT with a port of 0 to 65535", hostport);
    for (const char *p = hostport; p < colon; p++)
        if (*p == ' ' || *p == '/' || (unsigned char)*p < 0x21)
            return err_set(err, "address '%.80s' has a bad host name", hostport);
    return 0;
}

static int write_file(const char *dir, const char *name, const char *text, int mode, char *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return file_write_atomic(path, text, strlen(text), mode, err);
}

static const char ini_template[] =
    "; federation.ini — written by `strait init`; the coordinator reads it at start.\n"
    "\n"
    "[federation]\n"
    "; a name for people and logs\n"
    "name = %s\n"
    "; where the coordinator listens\n"
    "listen = %s\n"
    "; the HOST:PORT sites use to reach it (printed in join commands)\n"
    "advertise = %s\n"
    "; enrollment (strait site join) has a port of its own, the only one that takes\n"
    "; peers without a certificate: by default listen's and advertise's port plus one\n"
    "; (join_advertise's host must be one the coordinator's certificate names:\n"
    "; listen's or advertise's)\n"
    "; join_listen = HOST:PORT\n"
    "; join_advertise = HOST:PORT\n"
    "\n"
    "[model]\n"
    "%s"
    "\n"
    "[rounds]\n"
    "; rounds to train, then the federation is finished\n"
    "total = %d\n"
    "; a round closes when every active site has reported, or when this many\n"
    "; have and its deadline has passed: a number, or quorum (more than half of\n"
    "; the active sites)\n"
    "min_sites = %s\n"
    "deadline = %s\n"
    "; on: once a quorum is in, a round also closes at twice the slowest site's\n"
    "; 90th-percentile arrival over its last 8 rounds (first attempts after round 0;\n"
    "; 1 s at least), when that comes sooner than the deadline; a site late past it\n"
    "; sends to the next round; and at once when every site not in is away (nothing\n"
    "; from it in the round before, no call since this one opened)\n"
    "adaptive_deadline = on\n"
    "; a round short of quorum is extended this many deadlines, then failed and reopened\n"
    "max_extensions = 3\n"
    "; how updates combine: mean (weighted by tokens, streaming), or for untrusted\n"
    "; sites median or trimmed_mean (coordinate-wise; trim from each end, at least\n"
    "; one update each once there are three)\n"
    "aggregate = mean\n"
    "trim = 0.1\n"
    "; the mean: an update counts at most weight_cap x the round's median claim of\n"
    "; tokens, and is scaled down to clip x the round's median norm (0: off)\n"
    "weight_cap = 2\n"
    "clip = 3\n"
    "; on: until a round with a quorum has committed (round 0, and the first after the\n"
    "; coordinator restarts) no history of norms bounds an update, so the mean takes\n"
    "; the coordinate-wise median of three updates or more, and below three caps each\n"
    "; weight and norm at the round's median; off: weight_cap and clip as in any round\n"
    "robust_start = on\n"
    "; local AdamW steps each site takes per round (DiLoCo's H)\n"
    "inner_steps = %d\n"
    "; or fewer: a site stops after this much training time in a round (slow sites then\n"
    "; send fewer tokens and weigh less); 0: always H steps\n"
    "time_budget = 0\n"
    "; on: a site trains the next round while its update and the next model are in\n"
    "; flight, and a round takes updates trained from the round before's model too\n"
    "; (the one-step-delayed outer step); off: each round waits for its own model\n"
    "overlap = off\n"
    "; with overlap on: each site trains from the model it holds moved by this\n"
    "; fraction of the outer step its own last update would make (its estimate of\n"
    "; the step still in flight), 0 to 1; 0: from the model it holds. Nesterov and\n"
    "; avg only (adam: 0)\n"
    "lookahead = 0.5\n"
    "; sync: a round takes updates trained from its own model. async: a round\n"
    "; merges once its quorum is in and a grace window has passed (grace x the time\n"
    "; the quorum took), and takes updates trained from a model up to staleness\n"
    "; rounds old, weighted by tokens / sqrt(1 + staleness); older ones are refused\n"
    "mode = sync\n"
    "staleness = 4\n"
    "grace = 0.25\n"
    "; the most a site may train per inner step, all its GPUs together: batch\n"
    "; sequences of seq tokens (seq defaults to the model's context); an update that\n"
    "; claims more than inner_steps x batch x seq tokens is refused\n"
    "batch = 64\n"
    "; an update whose norm is over this many times the model's (as it was when the\n"
    "; coordinator started) is refused, from the first update of the first round on\n"
    "; (0: off); once a round with a quorum has committed, so is one over norm_bound\n"
    "; x the median of recent rounds' median norms\n"
    "max_update_ratio = 2\n"
    "norm_bound = 4\n"
    "\n"
    "[recipe]\n"
    "; codecs and outer optimizer known to train together (docs/tuning.md):\n"
    ";   diloco      int8 updates up, int8 outer updates down, outer Nesterov lr 0.7,\n"
    ";               momentum 0.3 (DiLoCo, INTELLECT-1; momentum from the sweep)\n"
    ";   sparseloco  top-k 256 of 4096 with 2-bit values both ways, error feedback with\n"
    ";               decay 0.95 in place of outer momentum, outer lr 1 (SparseLoCo)\n"
    ";   fedavg      fp32 up, the exact model down, the plain mean (lr 1)\n"
    ";   fedadam     int8 both ways, outer Adam lr 0.01\n"
    "name = %s\n"
    "\n"
    "[codec]\n"
    "; a key set here overrides the recipe's. What sites send: fp32, fp16, bf16, int8,\n"
    "; topk (int8 values) or topk2 (2-bit values); what they get: uplink (the same\n"
    "; codec, with error feedback at the coordinator), lossless (the exact model\n"
    "; delta) or a codec name; density: top-k's kept fraction; ef_decay: the\n"
    "; sites' error feedback e <- decay*e + update\n"
    "%suplink = %s\n"
    "; downlink = uplink\n"
    "; density = 0.0625\n"
    "; ef_decay = 1\n"
    "\n"
    "[optimizer]\n"
    "; overrides the recipe's outer step: nesterov (DiLoCo), avg (FedAvg: lr 1, no\n"
    "; momentum) or adam (FedAdam); an outer step apart from the recipe's takes its own\n"
    "; lr and momentum unless they are set too\n"
    "; outer = nesterov\n"
    "; lr = 0.7\n"
    "; momentum = 0.3\n"
    "\n"
    "[store]\n"
    "; checkpoints kept (docs/operations.md: the disk a federation needs): the newest\n"
    "; keep_last rounds, and every round numbered a multiple of keep_every (0: none).\n"
    "; Whatever these say, the newest round's outer optimizer state (the only one a\n"
    "; resume reads), the round before's model (the delta a restart serves) and, with\n"
    "; async rounds, the last `staleness` models are kept. A checkpoint is 4 bytes a\n"
    "; parameter, an outer state 4 to 12: the defaults hold a 1B-parameter DiLoCo\n"
    "; federation to about 24 GB between commits and 36 GB while one is written,\n"
    "; however many rounds it runs; each milestone is 4 GB more.\n"
    "keep_last = 2\n"
    "keep_every = 0\n"
    "\n"
    "[privacy]\n"
    "; central: differential privacy at the site level (docs/privacy.md). Each update\n"
    "; is clipped to clip (L2) and weighed alike, the mean given Gaussian noise of\n"
    "; noise_multiplier x clip / (its updates), epsilon at delta reported each round;\n"
    "; no round commits past epsilon_budget (0: none). With aggregate = mean only.\n"
    "; distributed: with secure_aggregation = on, each site clips its update and\n"
    "; adds its share of integer (Skellam) noise, so the coordinator never sees a\n"
    "; sum without noise; the same keys, epsilon accounted for the noise summed.\n"
    "dp = off\n"
    "; clip = 0.5\n"
    "; noise_multiplier = 1.0\n"
    "; delta = 1e-5\n"
    "; epsilon_budget = 8\n"
    "; on: the coordinator sees only the sum of the sites' updates (secure\n"
    "; aggregation, docs/privacy.md): each value is clipped to +-range and quantized\n"
    "; in bits (0: enough for the sites), masks that cancel in the sum added; a\n"
    "; phase's stragglers are waited for phase_timeout. Not with dp = central (use\n"
    "; dp = distributed), a robust aggregate, async or overlapped rounds, or top-k.\n"
    "secure_aggregation = off\n"
    "; range = 0.05\n"
    "; bits = 0\n"
    "; phase_timeout = 60s\n"
    "\n"
    "[security]\n"
    "; validity of the certificates issued to sites; they renew before expiry\n"
    "site_cert_days = 90\n"
    "; how long an enrollment token stays usable (strait site enroll --ttl overrides)\n"
    "token_ttl = 24h\n"
    "; the certificate a renewal replaces stays valid this long; no renewal is taken\n"
    "; meanwhile\n"
    "renew_overlap = 10m\n"
    "\n"
    "[limits]\n"
    "; handler threads; calls beyond them are answered RESOURCE_EXHAUSTED\n"
    "workers = 16\n"
    "; calls one site may have at once (long polls included); beyond: RESOURCE_EXHAUSTED\n"
    "calls_per_site = 4\n"
    "; workers only the admin's calls may take, so a busy federation stays manageable\n"
    "admin_reserve = 2\n"
    "; bytes of uploads the coordinator holds on disk, in all (spool) and per site\n"
    "; (spool_per_site; default three updates' worth)\n"
    "; spool = 68719476736\n"
    "; spool_per_site = 0\n"
    "; an upload stream is cut when its header, its next chunk or its end is this late\n"
    "upload_header = 30s\n"
    "upload_idle = 60s\n"
    "upload_life = 1h\n"
    "; past upload_grace, an upload must average upload_min_rate bytes/s (0: off)\n"
    "upload_min_rate = 16384\n"
    "upload_grace = 10s\n"
    "; updates of a site refused in a round before it is refused at the header\n"
    "refusals_per_round = 3\n"
    "; model downloads one site may make in a round\n"
    "downloads_per_round = 4\n"
    "; TCP connections held at once: in all (a quarter kept for connections that\n"
    "; presented a certificate), from one address before a certificate came on them\n"
    "; (past it, the address's oldest such connection makes room), and from one\n"
    "; address whatever they are (a NAT of sites); HTTP/2 streams open at once on one\n"
    "; connection\n"
    "connections = 4096\n"
    "connections_per_address = 128\n"
    "connections_per_site_address = 512\n"
    "streams_per_connection = 32\n"
    "; the enrollment port: connections at once, in all and from one address (each\n"
    "; ends 10 s after it is accepted)\n"
    "join_connections = 32\n"
    "join_connections_per_address = 4\n"
    "; failed joins from one address in a minute before it is refused for the minute\n"
    "join_failures = 10\n"
    "; bytes a connection may have in flight to the coordinator: auto sizes it from\n"
    "; the link's bandwidth x round trip (a 1 Gbit/s, 100 ms link needs 12.5 MB, and\n"
    "; the hosts' net.ipv4.tcp_wmem and tcp_rmem maximum at least twice that); a\n"
    "; number fixes it per upload, which caps a link at about that much per round\n"
    "; trip (4194304 at 100 ms: 54 Mbit/s measured)\n"
    "stream_window = auto\n"
    "; what the transport may hold for every connection together: past 80%% of it\n"
    "; windows shrink, then idle connections close, then streams are cancelled\n"
    "; (uploads resume from their offset)\n"
    "transport_memory = 268435456\n"
    "\n"
    "[metrics]\n"
    "; a Prometheus endpoint (plain HTTP, GET /metrics) at HOST:PORT, e.g. 127.0.0.1:9464\n"
    "; for this machine only; empty: off\n"
    "listen =\n";

/* The folder part of path, in buf. */
static const char *dirname_of(const char *path, char *buf, size_t len) {
    snprintf(buf, len, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash) *slash = '\0';
    return buf;
}

/* Adds the host of "host:port" to a SAN list as IP or DNS, once. */
static void san_add(char *san, size_t len, const char *addr) {
    char host[256], entry[300], padded[1200];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':');
    if (colon) *colon = '\0';
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0) return;
    struct in_addr a;
    snprintf(entry, sizeof entry, "%s:%s", inet_pton(AF_INET, host, &a) == 1 ? "IP" : "DNS", host);
    snprintf(padded, sizeof padded, ",%s,", san);
    char needle[310];
    snprintf(needle, sizeof needle, ",%s,", entry);
    if (strstr(padded, needle)) return;
    size_t n = strlen(san);
    snprintf(san + n, len - n, ",%s", entry);
}

/* The [model] section: a preset drawn from a seed, or the pretrained model
 * strait init wrote into the home, with the SHA-256s that tie it to its
 * source. */
static void model_section(char *out, size_t len, const CoordInitOptions *o, const Model *m,
                          const char *init_sha, const char *source_sha) {
    char adapter[1600] =
        "; adapter = lora fine-tunes low-rank adapters (rank, alpha, targets) over\n"
        "; the model, frozen: only they train and travel\n"
        "adapter = none\n";
    if (o->lora.rank > 0) {
        char targets[64], alpha[32], dropout[32];
        model_lora_targets_names(o->lora.targets, targets, sizeof targets);
        /* as the floats the initial model holds: the coordinator compares them */
        float_text(alpha, sizeof alpha, o->lora.alpha);
        float_text(dropout, sizeof dropout, o->lora.dropout);
        snprintf(adapter, sizeof adapter,
                 "; low-rank adapters (LoRA) over the model, frozen: only they train and travel,\n"
                 "; their output scaled by alpha / rank; targets of q, k, v, o, gate, up, down;\n"
                 "; rule ffa (A frozen at its draw from the seed, the same at every site: only B\n"
                 "; trains and travels, and its average is the sites' updates' exactly), fedsb\n"
                 "; (Fed-SB: A and B frozen at their draws, only the rank x rank R between them\n"
                 "; trains and travels, averaged exactly) or fedit (A and B both train, averaged\n"
                 "; apart: mean(B) mean(A) is not mean(B A)); base_dtype bf16 (the base's\n"
                 "; matmuls on bf16 copies of its weights, inputs rounded to bf16, sums in\n"
                 "; fp32) or f32; dropout: in training, that fraction of each adapter's input\n"
                 "; zeroed (PEFT's lora_dropout; 0 for none)\n"
                 "adapter = lora\n"
                 "rank = %d\n"
                 "alpha = %s\n"
                 "targets = %s\n"
                 "rule = %s\n"
                 "base_dtype = %s\n"
                 "dropout = %s\n",
                 o->lora.rank, alpha, targets, model_lora_rule_name(o->lora.rule),
                 o->lora.base_bf16 ? "bf16" : "f32", dropout);
    }
    if (o->init_from == NULL) {
        snprintf(out, len,
                 "; %s\n"
                 "preset = %s\n"
                 "; the initial model is drawn from this seed\n"
                 "seed = 1\n"
                 "%s",
                 model_preset_names(), o->model ? o->model : "small", adapter);
        return;
    }
    snprintf(
        out, len,
        "; round 0 starts from a pretrained model (strait init --init-from): a %s of %d\n"
        "; layers, %d channels, %d heads, context %d, vocabulary %d. init is its file here, which\n"
        "; the coordinator checks against init_sha256 at every start; source is the GGUF\n"
        "; file or folder it was read from, source_sha256 that file's or the folder's\n"
        "; model.safetensors'\n"
        "init = %s\n"
        "init_sha256 = %s\n"
        "source = %s\n"
        "source_sha256 = %s\n"
        "; the seed only draws nothing here: the model is the pretrained one\n"
        "seed = 1\n"
        "%s",
        model_arch_name(m->cfg.arch), m->cfg.L, m->cfg.C, m->cfg.NH, m->cfg.T, m->cfg.V,
        COORD_INIT_MODEL, init_sha, o->init_from, source_sha, adapter);
}

int coordinator_init_home(const char *dir, const CoordInitOptions *o, char ca_sha256[65],
                          char *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/federation.ini", dir);
    if (!o->force && access(path, F_OK) == 0)
        return err_set(err,
                       "%s already holds a federation; pass --force to replace it (its CA "
                       "and every site's enrollment are lost)",
                       dir);
    const char *listen = o->listen ? o->listen : "0.0.0.0:7700";
    const char *advertise = o->advertise ? o->advertise : listen;
    char name[128];
    if (o->name) {
        snprintf(name, sizeof name, "%s", o->name);
    } else {
        const char *base = strrchr(dir, '/');
        snprintf(name, sizeof name, "%s", base && base[1] ? base + 1 : dir);
    }
    if (strchr(name, '\n') || strchr(listen, '\n') || strchr(advertise, '\n'))
        return err_set(err, "names and addresses must be one line");
    if (coordinator_check_listen(listen, err) != 0) return -1;
    if (o->advertise && coordinator_check_listen(advertise, err) != 0) return -1;
    if (o->recipe && !rounds_recipe_known(o->recipe))
        return err_set(err, "unknown recipe '%s'; use %s", o->recipe, rounds_recipe_names());
    if (o->init_from && strchr(o->init_from, '\n'))
        return err_set(err, "the --init-from path must be one line");
    /* the pretrained model is read and checked before anything is written */
    Model pre;
    memset(&pre, 0, sizeof pre);
    char init_sha[65] = "", source_sha[65] = "";
    if (o->init_from) {
        int64_t bytes;
        /* the source's SHA-256: a GGUF file's own, a folder's model.safetensors' */
        if (gguf_path_is(o->init_from))
            snprintf(path, sizeof path, "%s", o->init_from);
        else
            snprintf(path, sizeof path, "%s/model.safetensors", o->init_from);
        /* with adapters, the initial model is theirs (drawn from seed 1, the
         * [model] seed) over the pretrained base, whose fingerprint it holds */
        if (model_import(&pre, o->init_from, err) != 0 ||
            (o->lora.rank > 0 && model_add_adapters(&pre, &o->lora, 1, err) != 0) ||
            security_sha256_file(path, source_sha, &bytes, err) != 0) {
            model_free(&pre);
            return -1;
        }
    }
    if (file_mkdir_p(dir, 0700, err) != 0) {
        model_free(&pre);
        return -1;
    }
    char *ca = NULL, *ca_key = NULL, *srv = NULL, *srv_key = NULL, *adm = NULL, *adm_key = NULL;
    int rc = -1;
    long year = 365L * 86400;
    char cn[200], san[600];
    snprintf(cn, sizeof cn, "Strait federation %s CA", name);
    SecurityCertSpec ca_spec = {cn, NULL, 1, 0, 0, 10 * year};
    if (security_cert_create(&ca_spec, NULL, NULL, &ca, &ca_key, err) != 0) goto out;
    snprintf(san, sizeof san, "DNS:localhost,IP:127.0.0.1");
    san_add(san, sizeof san, advertise);
    san_add(san, sizeof san, listen);
    SecurityCertSpec srv_spec = {"strait-coordinator", san, 0, 1, 0, 2 * year};
    SecurityCertSpec adm_spec = {COORD_ADMIN_NAME, NULL, 0, 0, 0, 2 * year};
    if (security_cert_create(&srv_spec, ca, ca_key, &srv, &srv_key, err) != 0 ||
        security_cert_create(&adm_spec, ca, ca_key, &adm, &adm_key, err) != 0)
        goto out;
    /* the server presents its chain, so a joining site can find the CA it pins */
    size_t chain_len = strlen(srv) + strlen(ca) + 1;
    char *chain = malloc(chain_len);
    if (chain == NULL) {
        err_set(err, "out of memory");
        goto out;
    }
    snprintf(chain, chain_len, "%s%s", srv, ca);
    char sub[1100], parent[1100], model_ini[3072];
    if (o->init_from) {
        snprintf(sub, sizeof sub, "%s/%s", dir, COORD_INIT_MODEL);
        int64_t bytes;
        if (file_mkdir_p(dirname_of(sub, parent, sizeof parent), 0700, err) != 0 ||
            model_save(&pre, sub, 0, err) != 0 ||
            security_sha256_file(sub, init_sha, &bytes, err) != 0) {
            free(chain);
            goto out;
        }
    }
    model_section(model_ini, sizeof model_ini, o, &pre, init_sha, source_sha);
    char ini[16384], min_sites[24] = "quorum";
    if (o->min_sites > 0) snprintf(min_sites, sizeof min_sites, "%d", o->min_sites);
    snprintf(ini, sizeof ini, ini_template, name, listen, advertise, model_ini,
             o->rounds > 0 ? o->rounds : 100, min_sites, o->deadline ? o->deadline : "10m",
             o->inner_steps > 0 ? o->inner_steps : 50, o->recipe ? o->recipe : "diloco",
             o->uplink ? "" : "; ", o->uplink ? o->uplink : "int8");
    int bad = write_file(dir, "ca.key", ca_key, 0600, err) ||
              write_file(dir, "ca.crt", ca, 0644, err) ||
              write_file(dir, "server.key", srv_key, 0600, err) ||
              write_file(dir, "server.crt", chain, 0644, err) ||
              write_file(dir, "admin.key", adm_key, 0600, err) ||
              write_file(dir, "admin.crt", adm, 0644, err);
    free(chain);
    if (bad) goto out;
    snprintf(path, sizeof path, "%s/%s", dir, STORE_DB_FILE);
    if (o->force) {
        unlink(path);
        char side[1100];
        snprintf(side, sizeof side, "%s-wal", path);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", path);
        unlink(side);
    }
    Store *st = store_open(path, STORE_READWRITE, err);
    if (st == NULL) goto out;
    /* the audit log starts with the federation: no init without it */
    int logged = store_event_add(st, "strait init", "federation.init", name, time_wall_ms(), err);
    if (o->init_from) { /* where round 0 came from, in the audit log */
        char detail[1800];
        snprintf(detail, sizeof detail,
                 "pretrained from %s (sha256 %s): %d layers, %d channels, %d "
                 "heads, context %d, vocabulary %d; %s sha256 %s",
                 o->init_from, source_sha, pre.cfg.L, pre.cfg.C, pre.cfg.NH, pre.cfg.T, pre.cfg.V,
                 COORD_INIT_MODEL, init_sha);
        if (logged == 0)
            logged = store_event_add(st, "strait init", "model.init", detail, time_wall_ms(), err);
    }
    store_close(st);
    if (logged != 0) goto out;
    chmod(path, 0600);
    snprintf(sub, sizeof sub, "%s/%s", dir, STORE_CHECKPOINT_DIR);
    if (file_mkdir_p(sub, 0700, err) != 0) goto out;
    /* federation.ini last, with nothing after it that can fail: its
     * presence marks a complete federation */
    SecurityIdentity id;
    if (security_cert_identity(ca, &id, err) != 0) goto out;
    if (write_file(dir, "federation.ini", ini, 0644, err) != 0) {
        /* renamed into place but its folder not synced: not complete */
        snprintf(path, sizeof path, "%s/federation.ini", dir);
        unlink(path);
        goto out;
    }
    memcpy(ca_sha256, id.sha256_hex, 65);
    rc = 0;
out:
    free(ca), free(ca_key), free(srv), free(srv_key), free(adm), free(adm_key);
    model_free(&pre);
    return rc;
}

int coordinator_home_info(const char *dir, char ca_sha256[65], char *advertise, size_t adv_len,
                          char *err) {
    char path[1024], *ca;
    snprintf(path, sizeof path, "%s/ca.crt", dir);
    if (file_read_all(path, 1 << 20, &ca, NULL, err) != 0) return -1;
    SecurityIdentity id;
    int rc = security_cert_identity(ca, &id, err);
    free(ca);
    if (rc != 0) return -1;
    memcpy(ca_sha256, id.sha256_hex, 65);
    snprintf(path, sizeof path, "%s/federation.ini", dir);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    snprintf(advertise, adv_len, "%s",
             config_get_str(cfg, "federation", "advertise",
                            config_get_str(cfg, "federation", "listen", "")));
    config_free(cfg);
    return 0;
}

int coordinator_join_address(const char *dir, char *out, size_t len, char *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/federation.ini", dir);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    const char *listen = config_get_str(cfg, "federation", "listen", "0.0.0.0:7700");
    const char *adv = config_get_str(cfg, "federation", "advertise", listen);
    const char *jadv = config_get(cfg, "federation", "join_advertise");
    const char *jlisten = config_get(cfg, "federation", "join_listen");
    int rc = 0;
    if (jadv) {
        snprintf(out, len, "%s", jadv);
    } else if (jlisten && strrchr(jlisten, ':') && strrchr(adv, ':')) {
        /* the advertised host, the enrollment listener's port */
        const char *ac = strrchr(adv, ':');
        snprintf(out, len, "%.*s%s", (int)(ac - adv), adv, strrchr(jlisten, ':'));
    } else if (net_enroll_default_address(adv, out, len) != 0) {
        rc = err_set(err, "%s: [federation] advertise = %s is not HOST:PORT", path, adv);
    }
    config_free(cfg);
    const char *colon = rc == 0 ? strrchr(out, ':') : NULL;
    char *bound = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, JOIN_ADDR_FILE);
    if (colon && strcmp(colon, ":0") == 0 && access(path, F_OK) == 0) {
        /* a federation on a random port (the demo's, the tests'): where it runs now */
        if (file_read_all(path, 300, &bound, NULL, err) != 0) return -1;
        snprintf(out, len, "%.*s", (int)strcspn(bound, "\r\n"), bound);
        free(bound);
    }
    return rc;
}

static Store *open_store(const char *dir, char *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, STORE_DB_FILE);
    if (access(path, F_OK) != 0) {
        err_set(err, "no federation in %s; create one with 'strait init %s'", dir, dir);
        return NULL;
    }
    return store_open(path, STORE_READWRITE, err);
}

int coordinator_token_ttl(const char *dir, int64_t *ttl_ms, char *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/federation.ini", dir);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    int rc = config_get_duration_ms(cfg, "security", "token_ttl", 24 * 3600 * 1000LL, ttl_ms, err);
    config_free(cfg);
    if (rc == 0 && *ttl_ms <= 0)
        rc = err_set(err, "%s: [security] token_ttl must be positive", path);
    return rc;
}

int coordinator_enroll_store(Store *s, const char *site, int64_t ttl_ms, const char *actor,
                             char token[65], char *err) {
    if (!coordinator_valid_site_name(site))
        return err_set(err,
                       "bad site name '%s'; use 1-64 letters, digits, '-', '_' or '.', starting "
                       "with a letter or a digit",
                       site);
    if (ttl_ms <= 0) return err_set(err, "a token must live a positive time");
    StoreSite existing;
    int rc = store_site_get(s, site, &existing, err);
    if (rc < 0) return -1;
    if (rc == 0 && strcmp(existing.state, "revoked") != 0)
        return err_set(err,
                       "site '%s' is already enrolled and active; revoke it first to "
                       "enroll it again",
                       site);
    uint8_t hash[SHA256_LEN];
    int64_t now = time_wall_ms();
    if (security_random_token(token, err) != 0) return -1;
    security_sha256(token, 64, hash);
    if (store_token_add(s, hash, site, now, now + ttl_ms, err) != 0 ||
        store_event_add(s, actor, "site.enroll", site, now, err) != 0)
        return -1;
    return 0;
}

int coordinator_enroll(const char *dir, const char *site, int64_t ttl_ms, char token[65],
                       char *err) {
    if (!coordinator_valid_site_name(site))
        return err_set(err,
                       "bad site name '%s'; use 1-64 letters, digits, '-', '_' or '.', starting "
                       "with a letter or a digit",
                       site);
    Store *s = open_store(dir, err);
    if (s == NULL) return -1;
    int rc = coordinator_enroll_store(s, site, ttl_ms, "strait site enroll", token, err);
    store_close(s);
    return rc;
}

int coordinator_revoke(const char *dir, const char *site, const char *actor, char *err) {
    Store *s = open_store(dir, err);
    if (s == NULL) return -1;
    int rc = store_site_revoke(s, site, actor, time_wall_ms(), err);
    store_close(s);
    return rc;
}
