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

#endif /* STRAIT_KERNELS_FORMATS_H */
