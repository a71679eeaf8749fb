/*
 * formats.h — the model's files: Strait's checkpoints (safetensors with the
 * table in the metadata, kernels/safetensors.c), and other tools' formats
 * in and out (Hugging Face GPT-2, llm.c; kernels/formats.c).
 */
#ifndef STRAIT_KERNELS_FORMATS_H
#define STRAIT_KERNELS_FORMATS_H

#include "kernels/model.h"

/* Writes the parameters (and, once AdamW has run, its moments to
 * "<path minus .safetensors>.opt.safetensors"), atomically. */
int gpt_save(const GPT *m, const char *path, int step, char *err);
/* Reads a checkpoint's model config and step from its metadata. */
int gpt_read_config(const char *path, GPTConfig *cfg, int *step, char *err);
/* Loads parameters into a model built with the same table; every offset,
 * dtype and shape is checked before data is copied. */
int gpt_load(GPT *m, const char *path, int *step, char *err);
/* Other per-parameter state laid out like the parameters (an outer
 * optimizer's momentum): tensor i of base b is named prefixes[b] + view name. */
int gpt_save_state(const GPT *m, const char *path, const float *const *bases,
                   const char *const *prefixes, int n_bases, int step, char *err);
int gpt_load_state(const GPT *m, const char *path, float *const *dsts, const char *const *prefixes,
                   int n_bases, char *err);
/* Writes AdamW's moments and step alone, atomically (an error before the
 * first step: there are none); gpt_load_optimizer reads them back. */
int gpt_save_optimizer(const GPT *m, const char *opt_path, char *err);
/* Loads AdamW's moments and step from a "<name>.opt.safetensors" file. */
int gpt_load_optimizer(GPT *m, const char *opt_path, char *err);

/* formats.c: the model for other tools. Hugging Face: DIR/config.json and
 * DIR/model.safetensors, loadable as transformers' GPT2LMHeadModel. llm.c:
 * the checkpoint file train_gpt2.c loads (header version 3, fp32). */
int gpt_export_hf(const GPT *m, const char *dir, char *err);
int gpt_export_llmc(const GPT *m, const char *path, char *err);
/* Builds m from a Hugging Face GPT-2 folder (config.json, model.safetensors
 * in F32, F16 or BF16, with or without the "transformer." prefix, in
 * PyTorch's layout — Conv1D [in, out], "weight" — or Flax's — Dense
 * [out, in], "kernel", "scale", "embedding"); m is built here and freed on
 * failure, which names the offending tensor. */
int gpt_import_hf(GPT *m, const char *dir, char *err);

#endif /* STRAIT_KERNELS_FORMATS_H */
