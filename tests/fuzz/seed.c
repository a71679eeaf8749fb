/*
 * seed.c — writes a seed corpus for the fuzz targets: valid update blobs of
 * every codec (with and without zstd, several tensor layouts), checkpoint
 * blobs (plain and XOR delta) and error-feedback states, so the fuzzer
 * starts deep inside the decoders instead of at the magic number.
 * Also safetensors checkpoints and states of fuzz_safetensors' small
 * table, a tokenizer (every byte and a few merges) with text, a token
 * shard, a small Hugging Face GPT-2 folder, a small Llama as GGUF and
 * PEFT's adapter_config.json.
 *
 *   seed CORPUS_ROOT      (writes CORPUS_ROOT/fuzz_<target>/)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compress/compress.h"
#include "kernels/model.h"
#include "kernels/data.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "security/security.h"

static void put(const char *dir, const char *name, const uint8_t *prefix, size_t plen,
                const uint8_t *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fwrite(prefix, 1, plen, f);
    fwrite(data, 1, len, f);
    fclose(f);
}

static char *dir_of(const char *root, const char *target) {
    static char dirs[8][1024];
    static int next;
    char *d = dirs[next++ % 8];
    snprintf(d, sizeof dirs[0], "%s/%s", root, target);
    mkdir(root, 0755);
    mkdir(d, 0755); /* may exist */
    return d;
}

/* fuzz_gguf: a GGUF as the blocks test writes it, by hand: tokenizer.ggml.*
 * keys (gpt2: tokens, token_type, merges, pre, ids, add_space_prefix) and
 * a tensor of each block type Strait decodes, finite f16 scales */
static void gguf_w(FILE *f, const void *v, size_t n) {
    fwrite(v, 1, n, f);
}
static void gguf_w64(FILE *f, uint64_t v) {
    gguf_w(f, &v, 8);
}
static void gguf_w32(FILE *f, uint32_t v) {
    gguf_w(f, &v, 4);
}
static void gguf_wstr(FILE *f, const char *s) {
    gguf_w64(f, strlen(s));
    gguf_w(f, s, strlen(s));
}
static void seed_gguf_blocks(const char *dir) {
    static const struct {
        const char *name;
        uint32_t type, block, bytes, scales[2];
    } T[] = {{"Q4_0", GGML_Q4_0, 32, 18, {0, 0}},   {"Q5_1", GGML_Q5_1, 32, 24, {0, 2}},
             {"Q8_0", GGML_Q8_0, 32, 34, {0, 0}},   {"Q4_K", GGML_Q4_K, 256, 144, {0, 2}},
             {"Q5_K", GGML_Q5_K, 256, 176, {0, 2}}, {"Q6_K", GGML_Q6_K, 256, 210, {208, 208}}};
    static const char *const tokens[] = {"a", "b", "c", "ab", "abc", "<|endoftext|>"};
    char path[1024];
    snprintf(path, sizeof path, "%s/blocks", dir);
    FILE *f = fopen(path, "wb");
    if (f == NULL) return;
    const int nt = (int)(sizeof T / sizeof T[0]);
    gguf_w(f, "GGUF", 4);
    gguf_w32(f, 3);
    gguf_w64(f, (uint64_t)nt);
    gguf_w64(f, 8);
    gguf_wstr(f, "tokenizer.ggml.model");
    gguf_w32(f, GGUF_STRING);
    gguf_wstr(f, "gpt2");
    gguf_wstr(f, "tokenizer.ggml.pre");
    gguf_w32(f, GGUF_STRING);
    gguf_wstr(f, "smollm");
    gguf_wstr(f, "tokenizer.ggml.tokens");
    gguf_w32(f, GGUF_ARRAY);
    gguf_w32(f, GGUF_STRING);
    gguf_w64(f, 6);
    for (int i = 0; i < 6; i++) gguf_wstr(f, tokens[i]);
    gguf_wstr(f, "tokenizer.ggml.token_type");
    gguf_w32(f, GGUF_ARRAY);
    gguf_w32(f, GGUF_I32);
    gguf_w64(f, 6);
    for (int i = 0; i < 6; i++) gguf_w32(f, i == 5 ? 3 : 1);
    gguf_wstr(f, "tokenizer.ggml.merges");
    gguf_w32(f, GGUF_ARRAY);
    gguf_w32(f, GGUF_STRING);
    gguf_w64(f, 2);
    gguf_wstr(f, "a b");
    gguf_wstr(f, "ab c");
    gguf_wstr(f, "tokenizer.ggml.bos_token_id");
    gguf_w32(f, GGUF_U32);
    gguf_w32(f, 5);
    gguf_wstr(f, "tokenizer.ggml.add_space_prefix");
    gguf_w32(f, GGUF_BOOL);
    gguf_w(f, "", 1);
    gguf_wstr(f, "tokenizer.chat_template");
    gguf_w32(f, GGUF_STRING);
    gguf_wstr(f, "{{ messages }}");
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        gguf_wstr(f, T[i].name);
        gguf_w32(f, 1);
        gguf_w64(f, 2 * (uint64_t)T[i].block);
        gguf_w32(f, T[i].type);
        gguf_w64(f, off);
        off += (2 * T[i].bytes + 31) / 32 * 32;
    }
    long at = ftell(f);
    static const uint8_t zeros[32];
    gguf_w(f, zeros, (size_t)((32 - at % 32) % 32));
    uint32_t s = 7;
    for (int i = 0; i < nt; i++) {
        uint8_t b[2 * 210 + 32] = {0};
        size_t n = 2 * T[i].bytes;
        for (size_t k = 0; k < n; k++) b[k] = (uint8_t)((s = s * 1103515245u + 12345u) >> 16);
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 2; j++) { /* f16 0.0625 and -0.03125 */
                uint16_t h = j ? 0xa800 : 0x2c00;
                memcpy(b + k * T[i].bytes + T[i].scales[j], &h, 2);
            }
        gguf_w(f, b, (n + 31) / 32 * 32);
    }
    fclose(f);
}

static char *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc(*len + 1);
    if (p && fread(p, 1, *len, f) != *len) *len = 0;
    fclose(f);
    return p;
}

/* fuzz_tokenizer: vocab.json of the 256 bytes in GPT-2's alphabet plus
 * "he", "ll", "hell", then NUL, merges, NUL, text. */
static void seed_hf(const char *root, const ModelConfig *hc, const char *name);

static void seed_tokenizer(const char *dir, const char *json_dir) {
    char v[8192];
    size_t n = (size_t)snprintf(v, sizeof v, "{");
    int shift = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)shift++;
        char u[8];
        if (cp == '"' || cp == '\\')
            snprintf(u, sizeof u, "\\%c", cp);
        else if (cp < 0x80)
            snprintf(u, sizeof u, "%c", cp);
        else
            snprintf(u, sizeof u, "%c%c", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
        n += (size_t)snprintf(v + n, sizeof v - n, "%s\"%s\":%d", b ? "," : "", u, b);
    }
    n += (size_t)snprintf(v + n, sizeof v - n, ",\"he\":256,\"ll\":257,\"hell\":258}");
    static const char rest[] = "#version: 0.2\nh e\nl l\nhe ll\n\0hello hell's  world\n\xff\xfe "
                               "caf\xc3\xa9 \xe4\xb8\xad 123";
    v[n++] = '\0';
    put(dir, "hand", (const uint8_t *)v, n, (const uint8_t *)rest, sizeof rest - 1);
    /* fuzz_tokenizer_json: the same vocabulary in a tokenizer.json with
     * Llama 3's Split regex, ignore_merges and a special token */
    v[n - 1 - strlen(",\"he\":256,\"ll\":257,\"hell\":258}")] = '\0';
    char json[16384];
    int jl = snprintf(json, sizeof json,
                      "{\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":%s,"
                      "\"he\":256,\"ll\":257,\"hell\":258},\"merges\":[[\"h\",\"e\"],"
                      "[\"l\",\"l\"],\"he ll\"]},\"normalizer\":null,\"pre_tokenizer\":"
                      "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                      "\"pattern\":{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
                      "\\\\p{L}+|\\\\p{N}{1,3}|\\\\s+\"},\"behavior\":\"Isolated\","
                      "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                      "\"use_regex\":false}]},\"added_tokens\":[{\"id\":300,\"content\":"
                      "\"<|begin_of_text|>\",\"special\":true}]}",
                      v);
    put(json_dir, "llama3", NULL, 0, (const uint8_t *)json, (size_t)jl);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: seed CORPUS_ROOT\n");
        return 2;
    }
    const char *root = argv[1];
    argv[1] = dir_of(root, "fuzz_blob");
    char *state_dir = dir_of(root, "fuzz_state"), *join_dir = dir_of(root, "fuzz_join");
    char *st_dir = dir_of(root, "fuzz_safetensors");
    enum { N = 3000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)sin(i * 0.37) * (i % 17 ? 0.01f : 0.5f);
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    uint64_t sizes[] = {1000, 24, N - 1024};
    char err[512], name[64];
    for (int c = 0; c < 6; c++)
        for (int z = 0; z < 2; z++) {
            CodecParams p;
            codec_params_parse(codecs[c], &p, err);
            p.zstd_level = z;
            if (p.id == CODEC_INT8) p.block = 512;
            if (p.id == CODEC_TOPK) p.chunk = 700, p.density = 0.05;
            CodecLayout L = {42, N, z ? sizes : NULL, z ? 3 : 0};
            Blob b = {0};
            if (codec_encode(&p, &L, x, &b, err) != 0) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            snprintf(name, sizeof name, "%s-z%d", codecs[c], z);
            put(argv[1], name, NULL, 0, b.data, b.len);
            blob_free(&b);
        }
    Blob ck = {0};
    float prev[1024];
    for (int i = 0; i < 1024; i++) prev[i] = x[i] * 0.99f;
    uint8_t sel = 0; /* even first byte: checkpoint; prev_len = (byte >> 1) * 512 */
    ckpt_encode(x, 4096, 4, NULL, 1, &ck, err);
    put(state_dir, "ckpt", &sel, 1, ck.data, ck.len);
    sel = 16; /* 8 * 512 = 4096 bytes of prev */
    ckpt_encode(x, 4096, 4, prev, 1, &ck, err);
    put(state_dir, "ckpt-xor", &sel, 1, ck.data, ck.len);
    blob_free(&ck);
    ErrorFeedback ef;
    ef_init(&ef, 100, 42, 0.9f, err);
    for (int i = 0; i < 100; i++) ef.e[i] = x[i];
    Blob s = {0};
    ef_serialize(&ef, &s, err);
    sel = 1;
    put(state_dir, "ef", &sel, 1, s.data, s.len);
    blob_free(&s);
    ef_free(&ef);
    /* fuzz_safetensors' table: wte [4, 3] and ln_f.bias [3] */
    ParamView views[2] = {{"wte", 2, {4, 3}, 0, 12}, {"ln_f.bias", 1, {3, 0}, 12, 3}};
    Model m;
    memset(&m, 0, sizeof m);
    m.cfg = (ModelConfig){.name = "fuzz", .L = 1, .C = 3, .NH = 1, .T = 4, .V = 4, .Vp = 4};
    m.views = views, m.n_views = 2, m.n_params = 15, m.table_hash = 0x1234, m.params = x;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", st_dir);
    const float *bases[1] = {x + 100};
    const char *prefixes[1] = {"outer_b."};
    if (model_save(&m, path, 3, err) != 0) fprintf(stderr, "%s\n", err);
    snprintf(path, sizeof path, "%s/state.safetensors", st_dir);
    if (model_save_state(&m, path, bases, prefixes, 1, 3, err) != 0) fprintf(stderr, "%s\n", err);
    char *csr, *key;
    if (security_csr_create("seed-site", &csr, &key, err) == 0) {
        put(join_dir, "csr", NULL, 0, (const uint8_t *)csr, strlen(csr));
        free(csr), free(key);
    }
    seed_tokenizer(dir_of(root, "fuzz_tokenizer"), dir_of(root, "fuzz_tokenizer_json"));
    /* fuzz_shard: a shard of 100 ids */
    uint32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = (uint32_t)(i * 37 % 500);
    snprintf(path, sizeof path, "%s/ids.bin", dir_of(root, "fuzz_shard"));
    if (tokens_write_bin(path, ids, 100, err) != 0) fprintf(stderr, "%s\n", err);
    /* fuzz_hf: a small GPT-2 as Hugging Face writes it, config.json NUL model.safetensors */
    ModelConfig hc = {.name = "custom", .L = 1, .C = 8, .NH = 2, .T = 8, .V = 16, .Vp = 64};
    /* and a Llama: grouped-query attention, untied, rope scaling */
    ModelConfig lc = {.name = "custom",
                      .arch = ARCH_LLAMA,
                      .L = 1,
                      .C = 8,
                      .NH = 2,
                      .T = 8,
                      .V = 16,
                      .Vp = 64,
                      .NKV = 1,
                      .HD = 4,
                      .F = 12,
                      .eps = 1e-5f,
                      .rope = {10000.0f, 8.0f, 1.0f, 4.0f, 4}};
    const ModelConfig *hcs[2] = {&hc, &lc};
    for (int k = 0; k < 2; k++) seed_hf(root, hcs[k], k ? "llama" : "gpt2");
    /* fuzz_gguf: the Llama as GGUF, F32 and Q8_0 */
    Model lm;
    ModelConfig lc8 = lc;
    lc8.C = 32, lc8.HD = 16, lc8.F = 32, lc8.rope.original_ctx = 8192;
    if (model_build(&lm, &lc8, 1, err) == 0) {
        char gp[1024];
        snprintf(gp, sizeof gp, "%s/f32", dir_of(root, "fuzz_gguf"));
        if (model_export_gguf(&lm, gp, GGML_F32, NULL, NULL, err) != 0)
            fprintf(stderr, "%s\n", err);
        snprintf(gp, sizeof gp, "%s/q8_0", dir_of(root, "fuzz_gguf"));
        if (model_export_gguf(&lm, gp, GGML_Q8_0, NULL, NULL, err) != 0)
            fprintf(stderr, "%s\n", err);
        model_free(&lm);
    }
    seed_gguf_blocks(dir_of(root, "fuzz_gguf"));
    /* and the folder transformers 4 saved (BF16), with its config in transformers 4's form
     * and in 5's (tests/fixtures; make fuzz runs in the source tree) */
    static const char *const configs[] = {"tests/fixtures/llama-transformers4/config.json",
                                          "tests/fixtures/configs/llama-transformers5.json"};
    for (int k = 0; k < 2; k++) {
        size_t cl, ml;
        char *cj = read_whole(configs[k], &cl),
             *mb = read_whole("tests/fixtures/llama-transformers4/model.safetensors", &ml);
        if (cj && mb) {
            cj[cl] = '\0';
            put(dir_of(root, "fuzz_hf"), k ? "transformers5" : "transformers4", (const uint8_t *)cj,
                cl + 1, (const uint8_t *)mb, ml);
        }
        free(cj), free(mb);
    }
    /* fuzz_model_config: a GPT-2's description and a Llama's, and the
     * Llama with adapters under each rule */
    for (int k = 0; k < 2 + LORA_RULE_COUNT; k++) {
        ModelConfig c = *hcs[k ? 1 : 0];
        char name[32];
        snprintf(name, sizeof name, "%s", k ? "llama" : "gpt2");
        if (k >= 2) {
            c.lora = (AdapterConfig){.rank = 2,
                                     .alpha = 4,
                                     .targets = LORA_Q | LORA_DOWN,
                                     .base = 0x1234,
                                     .base_seed = 1,
                                     .rule = k - 2,
                                     .a_seed = 9,
                                     .base_bf16 = k % 2,            /* base_dtype bf16 in some */
                                     .dropout = k % 2 ? 0 : 0.05f}; /* dropout in the others */
            snprintf(name, sizeof name, "llama-%s", model_lora_rule_name(k - 2));
        }
        char *text = model_config_json(&c);
        put(dir_of(root, "fuzz_model_config"), name, NULL, 0, (const uint8_t *)text, strlen(text));
        free(text);
    }
    /* fuzz_hf_index: an index of two shards */
    static const char index[] =
        "{\"metadata\": {\"total_size\": 64}, \"weight_map\": "
        "{\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\", "
        "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}";
    put(dir_of(root, "fuzz_hf_index"), "two", NULL, 0, (const uint8_t *)index, strlen(index));
    /* fuzz_peft: adapter_config.json as PEFT 0.21 saves it */
    static const char peft[] =
        "{\"alora_invocation_tokens\": null, \"alpha_pattern\": {}, \"arrow_config\": null, "
        "\"auto_mapping\": null, \"base_model_name_or_path\": \"HuggingFaceTB/SmolLM2-135M\", "
        "\"bias\": \"none\", \"corda_config\": null, \"ensure_weight_tying\": false, "
        "\"eva_config\": null, \"exclude_modules\": null, \"fan_in_fan_out\": false, "
        "\"inference_mode\": true, \"init_lora_weights\": true, \"kasa_config\": null, "
        "\"layer_replication\": null, \"layers_pattern\": null, \"layers_to_transform\": null, "
        "\"loftq_config\": {}, \"lora_alpha\": 8, \"lora_bias\": false, \"lora_dropout\": 0.05, "
        "\"lora_ga_config\": null, \"megatron_config\": null, \"megatron_core\": "
        "\"megatron.core\", \"modules_to_save\": null, \"monteclora_config\": null, "
        "\"peft_type\": \"LORA\", \"peft_version\": \"0.21.2\", \"qalora_group_size\": 16, "
        "\"r\": 4, \"rank_pattern\": {}, \"revision\": null, \"target_modules\": [\"q_proj\", "
        "\"v_proj\"], \"target_parameters\": null, \"task_type\": \"CAUSAL_LM\", "
        "\"trainable_token_indices\": null, \"use_bdlora\": null, \"use_dora\": false, "
        "\"use_qalora\": false, \"use_rslora\": false, \"velora_config\": null}";
    put(dir_of(root, "fuzz_peft"), "peft-0.21", NULL, 0, (const uint8_t *)peft, sizeof peft - 1);
    /* fuzz_enroll: a request frame and a refusal's answer */
    static const uint8_t request[] = "STJ1\x00\x00\x00\x05hello";
    static const uint8_t answer[] = "STJ1\x07\x00\x00\x00\x02no";
    put(dir_of(root, "fuzz_enroll"), "request", NULL, 0, request, sizeof request - 1);
    put(dir_of(root, "fuzz_enroll"), "answer", NULL, 0, answer, sizeof answer - 1);
    return 0;
}

/* fuzz_hf's seed: the config's model as Hugging Face writes it, config.json
 * NUL model.safetensors */
static void seed_hf(const char *root, const ModelConfig *hc, const char *name) {
    char err[ERR_LEN], path[1024];
    Model hm;
    char hdir[900];
    snprintf(hdir, sizeof hdir, "%s/hf-tmp", root);
    if (model_build(&hm, hc, 1, err) == 0 && model_export_hf(&hm, hdir, NULL, err) == 0) {
        size_t cl, ml;
        snprintf(path, sizeof path, "%s/config.json", hdir);
        char *cj = read_whole(path, &cl);
        snprintf(path, sizeof path, "%s/model.safetensors", hdir);
        char *mb = read_whole(path, &ml);
        if (cj && mb) {
            cj[cl] = '\0';
            put(dir_of(root, "fuzz_hf"), name, (const uint8_t *)cj, cl + 1, (const uint8_t *)mb,
                ml);
        }
        free(cj), free(mb);
        remove(path);
        snprintf(path, sizeof path, "%s/config.json", hdir);
        remove(path);
        snprintf(path, sizeof path, "%s/generation_config.json", hdir);
        remove(path);
        remove(hdir);
        model_free(&hm);
    } else {
        fprintf(stderr, "%s\n", err);
    }
}
