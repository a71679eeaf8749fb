/*
 * formats.h — the model's files: Strait's checkpoints (safetensors with the
 * table in the metadata, kernels/safetensors.c), and other tools' formats
 * in and out (Hugging Face GPT-2, llm.c; kernels/formats.c).
 */
#ifndef STRAIT_KERNELS_FORMATS_H
#define STRAIT_KERNELS_FORMATS_H

#include "kernels/model.h"
#include "util/util.h"

/* Writes the parameters (and, once AdamW has run, its moments to
 * "<path minus .safetensors>.opt.safetensors"), atomically. */
int model_save(const Model *m, const char *path, int step, char *err);
/* Reads a checkpoint's model config and step from its metadata. */
int model_read_config(const char *path, ModelConfig *cfg, int *step, char *err);
/* Loads parameters into a model built with the same table; every offset,
 * dtype and shape is checked before data is copied. */
int model_load(Model *m, const char *path, int *step, char *err);
/* Other per-parameter state laid out like the parameters (an outer
 * optimizer's momentum): tensor i of base b is named prefixes[b] + view name. */
int model_save_state(const Model *m, const char *path, const float *const *bases,
                     const char *const *prefixes, int n_bases, int step, char *err);
int model_load_state(const Model *m, const char *path, float *const *dsts,
                     const char *const *prefixes, int n_bases, char *err);
/* Writes AdamW's moments and step alone, atomically (an error before the
 * first step: there are none); model_load_optimizer reads them back. */
int model_save_optimizer(const Model *m, const char *opt_path, char *err);
/* The same file with the moments' bytes from elsewhere (a sharded
 * trainer's ranks): fill(ctx, k, at, n, buf) puts values [at, at + n) of
 * the table's m (k 0) or v (k 1) into buf at el bytes a value (2: bf16
 * moments), asked for in table order, m then v, in pieces of at most
 * MODEL_SAVE_PIECE values starting at multiples of it; every piece is
 * asked for even after a write failed, so whoever sends them is never left
 * waiting. */
#define MODEL_SAVE_PIECE ((size_t)1 << 22)
int model_save_optimizer_from(const Model *m, const char *opt_path, int el,
                              void (*fill)(void *ctx, int k, size_t at, size_t n, void *buf),
                              void *ctx, char *err);
/* Loads AdamW's moments and step from a "<name>.opt.safetensors" file. */
int model_load_optimizer(Model *m, const char *opt_path, char *err);

/* formats.c: llm.c's checkpoint (header version 3, fp32), GPT-2 only. */
int model_export_llmc(const Model *m, const char *path, char *err);

/* hf.c: Hugging Face. Out: a folder transformers' GPT2LMHeadModel,
 * LlamaForCausalLM or Qwen2ForCausalLM.from_pretrained loads (PyTorch's
 * layout): config.json (transformers 4's form, which 5 reads too), the
 * tensors in one model.safetensors or, past max_shard bytes, shards and
 * model.safetensors.index.json, generation_config.json with the token ids,
 * and the tokenizer files of tokenizer_dir (tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt,
 * chat_template.jinja, tokenizer.model, added_tokens.json) copied as they
 * are; the ids are that folder's (its generation_config.json's, else its
 * config.json's) unless given. o NULL: HF_EXPORT_DEFAULTS. */
enum { HF_F32, HF_BF16, HF_F16 };
#define HF_SHARD_DEFAULT ((size_t)5000000000) /* transformers' "5GB" */
typedef struct HfExport {
    int dtype;                 /* HF_F32, HF_BF16 or HF_F16 (rounded to nearest, ties to even) */
    size_t max_shard;          /* bytes of tensors a file holds at most; 0: HF_SHARD_DEFAULT */
    const char *tokenizer_dir; /* a Hugging Face folder with tokenizer files; NULL: none */
    int bos, eos, pad;         /* token ids; -1: tokenizer_dir's, else none */
} HfExport;
#define HF_EXPORT_DEFAULTS                                                                         \
    { HF_F32, 0, NULL, -1, -1, -1 }
int model_export_hf(const Model *m, const char *dir, const HfExport *o, char *err);
/* In: a folder of any of the three (SmolLM2 and Llama 2 and 3 are
 * LlamaForCausalLM): config.json in transformers 4's form or 5's and
 * model.safetensors or the shards of model.safetensors.index.json, F32,
 * F16 or BF16, PyTorch's layout or Flax's, mapped rather than read; m is
 * built here and freed on failure, which names the offending field,
 * tensor or file. */
int model_import_hf(Model *m, const char *dir, char *err);
/* A config.json (path) into cfg, checked: every field one Strait honours
 * or knows to be harmless (kernels/hf_config.c), -1 naming the first that
 * is not. */
int hf_config_load(const char *path, ModelConfig *cfg, char *err);

/* model.safetensors.index.json's weight_map, checked: every tensor maps to
 * a *.safetensors file of the same folder (no path), at most 4096 files. */
#define HF_SHARD_NAME 256
typedef struct HfIndex {
    json_t *map; /* tensor name -> file (owned reference) */
    char (*files)[HF_SHARD_NAME];
    int n_files;
} HfIndex;
int hf_index_parse(const char *text, size_t len, HfIndex *ix, char *err);
void hf_index_free(HfIndex *ix);

/* ---- PEFT's LoRA adapters (kernels/peft.c) ------------------------------------------ */

/* Out: DIR/adapter_config.json (PEFT's keys for plain LoRA: r, lora_alpha,
 * target_modules as q_proj, v_proj, ..., every other at its neutral value;
 * base_model_name_or_path base_name, or null) and
 * DIR/adapter_model.safetensors (F32, PEFT's names
 * "base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight", A
 * (r, in), B (out, r); metadata {"format": "pt"}), each atomically. What
 * PeftModel.from_pretrained loads over the base. m must have adapters;
 * Fed-SB's go out as plain LoRA with R folded into A (lora_A = R·A,
 * lora_B = B, lora_alpha as trained: the same update). */
int model_export_peft(const Model *m, const char *dir, const char *base_name, char *err);
/* adapter_config.json's text into a (rank, alpha, targets, dropout from
 * lora_dropout, 0 to below 1; base 0 and base_seed -1: a pretrained
 * base): PEFT's plain LoRA alone. target_modules a list of projection
 * names (or "all-linear"); every key that would change the arithmetic at
 * its neutral value (use_rslora, use_dora, bias "none", fan_in_fan_out,
 * modules_to_save, rank_pattern, alpha_pattern, layers_to_transform, ...);
 * the keys that do not (task_type, base_model_name_or_path, ...) taken as
 * they are; any other key refused. -1 naming the key and what to do. */
int peft_config_parse(const char *text, size_t len, AdapterConfig *a, char *err);
/* In: m, a base without adapters (model_import's), gets DIR's adapters:
 * the config (peft_config_parse), then every tensor of
 * adapter_model.safetensors (F32, BF16 or F16; each name, dtype, shape and
 * byte range checked, none missing and none more, every layer adapted).
 * A model with Fed-SB's adapters is refused (plain LoRA does not split
 * into B·R·A over a given B and A). On failure m is freed; err names the
 * file, key or tensor. */
int model_import_peft(Model *m, const char *dir, char *err);
/* model_import of base_path then model_import_peft of peft_dir: what
 * --init-from takes for an adapter folder over its base. m is built here
 * and freed on failure. */
int model_import_adapted(Model *m, const char *base_path, const char *peft_dir, char *err);
/* A plain model (no adapters; out built here) equal to m's base with
 * W += (alpha / r) B A (Fed-SB: B (R A)) for each adapted projection: what the Hugging Face
 * and GGUF exports write as the merged model. */
int model_merge_adapters(const Model *m, Model *out, char *err);

/* hf.c, for peft.c: one safetensors file. st_write writes 2-D F32 tensors
 * in order with metadata {"format": "pt"}, atomically; st_map maps
 * DIR/FILE and parses its header (NULL with err), st_header is that
 * header (each tensor's entry, and __metadata__), st_take checks tensor
 * name (F32, F16 or BF16, shape (rows, cols), its bytes inside the file)
 * and converts it to fp32 into dst (NULL: only checked). */
typedef struct StTensor {
    char name[160];
    int shape[2];
    const float *src;
} StTensor;
int st_write(const char *path, const StTensor *ts, int n, char *err);
typedef struct StMap StMap;
StMap *st_map(const char *dir, const char *file, char *err);
json_t *st_header(const StMap *s);
int st_take(const StMap *s, const char *name, int rows, int cols, float *dst, char *err);
void st_unmap(StMap *s);

#endif /* STRAIT_KERNELS_FORMATS_H */
